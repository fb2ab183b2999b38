"""igemm-tc v5 -> v6 against cuDNN over the 14 dense rows x 3 directions, per dtype. Run: python3 compare.py

before: v5 (`tc-v5` of sweep-<dtype>.json: PORTCONV_CUDA_IGEMM_TC_V5=1, no TN tile; and `tc-128x64` of
narrow-<dtype>.json for the backward-data of resnet50-stem and deepbench-speech-c1, the tile v5 took there). after:
v6 (`tc-auto` of sweep-<dtype>.json; `tc-auto` of narrow-<dtype>.json for those two cells, measured after the narrow
tile's swizzle fix). Both from the same processes. cuDNN: the median of every cuDNN time the v4, v5 and v6 sweeps
measured for the cell (it moved up to 4x, once 14x, between processes), the same for before and after.
"""
import pathlib
import sys

HERE = pathlib.Path(__file__).parent
sys.path.insert(0, str(HERE.parent))
from sweeps import DTYPES, load, moved, pooled_cudnn, table  # noqa: E402

NARROW = ("resnet50-stem", "deepbench-speech-c1")

before, after = {}, {}
for dt in DTYPES:
    before |= load(HERE / f"sweep-{dt}.json", "tc-v5")
    after |= load(HERE / f"sweep-{dt}.json", "tc-auto")
    nb, na = load(HERE / f"narrow-{dt}.json", "tc-128x64"), load(HERE / f"narrow-{dt}.json", "tc-auto")
    for k in na:
        if k[0] in NARROW and k[2] == "bwd-data":
            before[k], after[k] = nb[k], na[k]
cudnn, runs = pooled_cudnn(HERE.parent, "v[456]", after)
table(before, after, cudnn, "v5", "v6")
moved(before, after, cudnn, runs, "v5", "v6")
