"""Does the first cuDNN call for a shape fix the plan that later calls run, whatever cudnn.benchmark says?
deepbench-b1-3x3's grad-weight (and forward) timed with CUDA events in one process, in the order given on the
command line: `d` = torch defaults (benchmark off), `b` = cudnn.benchmark on.
Usage: python3 cudnn_cache_order.py d b d"""
import sys

import torch

x = torch.randn(1, 64, 112, 112, device="cuda")
w = torch.randn(128, 64, 3, 3, device="cuda")
gy = torch.randn(1, 128, 112, 112, device="cuda")
op = torch.ops.aten.convolution_backward.default


def bwd_weight():
    return op(gy, x, w, [128], [1, 1], [1, 1], [1, 1], False, [0, 0], 1, [False, True, False])


def fwd():
    return torch.ops.aten.convolution(x, w, None, [1, 1], [1, 1], [1, 1], False, [0, 0], 1)


def median_ms(f, n=200):
    for _ in range(20):
        f()
    torch.cuda.synchronize()
    ts = []
    for _ in range(n):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        f()
        b.record()
        b.synchronize()
        ts.append(a.elapsed_time(b))
    ts.sort()
    return ts[n // 2]


for mode in sys.argv[1:]:
    torch.backends.cudnn.benchmark = mode == "b"
    print(f"{mode}: fwd {median_ms(fwd):.4f} ms  bwd-weight {median_ms(bwd_weight):.4f} ms", flush=True)
