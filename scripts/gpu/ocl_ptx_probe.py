"""Does NVIDIA's OpenCL compiler take inline PTX, and the tensor-core mma.sync in it?

One work-group of 32 work-items (one warp) runs mma.sync.m16n8k16 (f16 x f16 -> f32) from inline PTX in an OpenCL C
kernel; the result is compared with numpy. Prints the build outcome, the PTX target line, and the max error.
Run on the GPU machine with the OpenCL ICD named (scripts/gpu/opencl_dense.sh shows how).
"""
import sys

import numpy as np
import pyopencl as cl

SRC = r"""
__kernel void probe(__global const uint *a, __global const uint *b, __global float *c) {
    const uint l = get_local_id(0);
    float d0 = 0.f, d1 = 0.f, d2 = 0.f, d3 = 0.f;
    const uint a0 = a[4 * l], a1 = a[4 * l + 1], a2 = a[4 * l + 2], a3 = a[4 * l + 3], b0 = b[2 * l], b1 = b[2 * l + 1];
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};"
                 : "+f"(d0), "+f"(d1), "+f"(d2), "+f"(d3)
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
    c[4 * l] = d0; c[4 * l + 1] = d1; c[4 * l + 2] = d2; c[4 * l + 3] = d3;
}
"""


def pack(lo, hi):
    return np.uint32(lo.view(np.uint16)) | (np.uint32(hi.view(np.uint16)) << 16)


def main() -> int:
    dev = None
    for p in cl.get_platforms():
        if "NVIDIA" in p.name:
            dev = p.get_devices()[0]
    if dev is None:
        print("no NVIDIA OpenCL platform")
        return 1
    ctx = cl.Context([dev])
    q = cl.CommandQueue(ctx)
    print("device:", dev.name, dev.version, dev.driver_version)
    try:
        prg = cl.Program(ctx, SRC).build()
    except Exception as e:  # noqa: BLE001
        print("BUILD FAILED:", str(e)[:3000])
        return 1
    ptx = prg.get_info(cl.program_info.BINARIES)[0].decode(errors="replace")
    print("ptx header:", [ln for ln in ptx.splitlines() if ln.startswith((".version", ".target"))])
    print("mma in ptx:", "mma.sync" in ptx)
    rng = np.random.default_rng(0)
    A = rng.uniform(-1, 1, (16, 16)).astype(np.float16)
    B = rng.uniform(-1, 1, (16, 8)).astype(np.float16)
    a = np.zeros((32, 4), np.uint32)
    b = np.zeros((32, 2), np.uint32)
    for lane in range(32):
        g, t = lane >> 2, lane & 3
        a[lane] = [pack(A[g, 2 * t], A[g, 2 * t + 1]), pack(A[g + 8, 2 * t], A[g + 8, 2 * t + 1]),
                   pack(A[g, 2 * t + 8], A[g, 2 * t + 9]), pack(A[g + 8, 2 * t + 8], A[g + 8, 2 * t + 9])]
        b[lane] = [pack(B[2 * t, g], B[2 * t + 1, g]), pack(B[2 * t + 8, g], B[2 * t + 9, g])]
    mf = cl.mem_flags
    da = cl.Buffer(ctx, mf.READ_ONLY | mf.COPY_HOST_PTR, hostbuf=a)
    db = cl.Buffer(ctx, mf.READ_ONLY | mf.COPY_HOST_PTR, hostbuf=b)
    c = np.full((32, 4), np.nan, np.float32)
    dc = cl.Buffer(ctx, mf.WRITE_ONLY, c.nbytes)
    prg.probe(q, (32,), (32,), da, db, dc)
    cl.enqueue_copy(q, c, dc)
    q.finish()
    C = np.zeros((16, 8), np.float32)
    for lane in range(32):
        g, t = lane >> 2, lane & 3
        C[g, 2 * t], C[g, 2 * t + 1], C[g + 8, 2 * t], C[g + 8, 2 * t + 1] = c[lane]
    ref = A.astype(np.float64) @ B.astype(np.float64)
    err = float(np.abs(C - ref).max())
    print(f"mma.sync in OpenCL: max |err| = {err:.3g} ->", "OK" if err < 1e-3 else "WRONG")
    return 0 if err < 1e-3 else 1


if __name__ == "__main__":
    sys.exit(main())
