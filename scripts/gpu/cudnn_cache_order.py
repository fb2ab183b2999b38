"""Does the first cuDNN call for a shape fix the plan that later calls run, whatever cudnn.benchmark says?
deepbench-b1-3x3's grad-weight (and forward) timed with CUDA events in one process, in the order given on the
command line: `d` = torch defaults (benchmark off), `b` = cudnn.benchmark on.
Usage: python3 cudnn_cache_order.py d b d"""
import sys

import torch
from sweep import median_ms  # the GPU scripts' CUDA-event median (scripts/gpu/sweep.py)

x = torch.randn(1, 64, 112, 112, device="cuda")
w = torch.randn(128, 64, 3, 3, device="cuda")
gy = torch.randn(1, 128, 112, 112, device="cuda")
op = torch.ops.aten.convolution_backward.default


def bwd_weight():
    return op(gy, x, w, [128], [1, 1], [1, 1], [1, 1], False, [0, 0], 1, [False, True, False])


def fwd():
    return torch.ops.aten.convolution(x, w, None, [1, 1], [1, 1], [1, 1], False, [0, 0], 1)


for mode in sys.argv[1:]:
    torch.backends.cudnn.benchmark = mode == "b"
    f, bw = median_ms(fwd, "cuda", 200), median_ms(bwd_weight, "cuda", 200)
    print(f"{mode}: fwd {f:.4f} ms  bwd-weight {bw:.4f} ms", flush=True)
