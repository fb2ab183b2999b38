"""Machine code of portconv's CUDA kernels without a GPU: nvcc builds an entry for one arch in the four dtypes and this
prints a hash of each kernel's .text section, so a refactor can be shown to leave the measured kernels byte-identical
(or be seen to change them), as the H100 timed them.

    python scripts/kernel_hashes.py depthwise.cu REV_OR_WORKTREE [REV2] [-DNAME=VALUE ...] [--arch=sm_90]
        [--dtypes=0,2,3]   (PC_DTYPE values to build; the tensor-core tile takes 0, 2, 3)

With two sources it prints the kernels whose code differs (both built with the same -D defines). Needs nvcc
(CUDA 13's, as CI has); the hashes are nvcc's, the runtime compiles with NVRTC (scripts/nvrtc_regs.py).
"""
from __future__ import annotations

import hashlib
import os
import struct
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def text_sections(cubin: bytes) -> dict[str, str]:
    """{kernel: md5 of its .text section} of an ELF64 cubin."""
    shoff, = struct.unpack_from("<Q", cubin, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", cubin, 0x3A)
    hdr = [struct.unpack_from("<IIQQQQIIQQ", cubin, shoff + i * shentsize) for i in range(shnum)]
    names = hdr[shstrndx][4]
    out = {}
    for h in hdr:
        name = cubin[names + h[0]: cubin.index(b"\0", names + h[0])].decode()
        if name.startswith(".text."):
            out[name[6:]] = hashlib.md5(cubin[h[4]: h[4] + h[5]]).hexdigest()[:12]
    return out


def hashes(entry: str, source: str, defines: list[str], arch: str,
           dtypes: tuple[int, ...] = (0, 1, 2, 3)) -> dict[tuple[int, str], str]:
    """{(PC_DTYPE, kernel): hash} of ``entry`` from git revision ``source`` or the working tree ("WORKTREE")."""
    nvcc = os.path.join(os.environ.get("CUDA_HOME", "/usr/local/cuda"), "bin", "nvcc")
    nvcc = nvcc if os.path.exists(nvcc) else "nvcc"
    with tempfile.TemporaryDirectory() as tmp:
        if source == "WORKTREE":
            cuda = os.path.join(ROOT, "cuda")
        else:
            subprocess.run(f"git -C {ROOT} archive {source} cuda | tar -x -C {tmp}", shell=True, check=True)
            cuda = os.path.join(tmp, "cuda")
        out = {}
        for dt in dtypes:
            cubin = os.path.join(tmp, f"k{dt}.cubin")
            subprocess.run([nvcc, "-cubin", f"-arch={arch}", "-std=c++17", f"-DPC_DTYPE={dt}", "-DPC_INDEX64=0",
                            *defines, os.path.join(cuda, entry), "-o", cubin], check=True, capture_output=True)
            with open(cubin, "rb") as f:
                out.update({(dt, k): v for k, v in text_sections(f.read()).items()})
        return out


if __name__ == "__main__":
    args = sys.argv[1:]
    arch = next((a.split("=", 1)[1] for a in args if a.startswith("--arch=")), "sm_90")
    dtypes = next((tuple(map(int, a.split("=", 1)[1].split(","))) for a in args if a.startswith("--dtypes=")),
                  (0, 1, 2, 3))
    defines = [a for a in args if a.startswith("-D")]
    entry, *sources = [a for a in args if not a.startswith(("-D", "--arch=", "--dtypes="))]
    got = [hashes(entry, s, defines, arch, dtypes) for s in sources]
    if len(got) == 1:
        print("\n".join(f"{dt} {k} {v}" for (dt, k), v in sorted(got[0].items())))
    else:
        diff = sorted(k for k in got[0].keys() | got[1].keys() if got[0].get(k) != got[1].get(k))
        print("\n".join(f"differs: PC_DTYPE={dt} {k}" for dt, k in diff) or f"all {len(got[0])} kernels identical")
