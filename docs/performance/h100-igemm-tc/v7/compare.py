"""igemm-tc v6 -> v7 against cuDNN over the 14 dense rows x 3 directions, per dtype. Run: python3 compare.py

before: v6 (`tc-v6` of sweep-<dtype>.json: PORTCONV_CUDA_IGEMM_TC_V6=1, TF32 with 32-bit fragment loads, its register
double buffer and v6's tile rule). after: v7 (`tc-auto`). Both from the same processes (device call 4, final code).
cuDNN: the median of every cuDNN time the v4-v7 sweeps measured for the cell (it moved up to 4x, once 14x, between
processes), the same for before and after. The 16-bit kernels did not change in v7 (only the tile rule's reduction
clause reaches them), so their cells measure the noise of identical code, and resnet50-1x1-expand's forward.
"""
import pathlib
import sys

HERE = pathlib.Path(__file__).parent
sys.path.insert(0, str(HERE.parent))
from sweeps import DTYPES, load, moved, pooled_cudnn, table  # noqa: E402

before, after = {}, {}
for dt in DTYPES:
    before |= load(HERE / f"sweep-{dt}.json", "tc-v6")
    after |= load(HERE / f"sweep-{dt}.json", "tc-auto")
cudnn, runs = pooled_cudnn(HERE.parent, "v[4567]", after)
table(before, after, cudnn, "v6", "v7")
moved(before, after, cudnn, runs, "v6", "v7")
