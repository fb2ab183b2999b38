"""Machine code of portconv's CUDA kernels without a GPU: nvcc builds entries for one arch and this prints a hash of
each kernel's .text section, so a refactor can be shown to leave the measured kernels byte-identical (or be seen to
change them).

    python scripts/kernel_hashes.py depthwise.cu REV_OR_WORKTREE [REV2] [-DNAME=VALUE ...] [--arch=sm_90]
        [--dtypes=0,2,3]   (PC_DTYPE values to build; the tensor-core tile takes 0, 2, 3)
    python scripts/kernel_hashes.py --all REV_OR_WORKTREE [REV2] [--arch=sm_90] [--jobs=2]

With two sources it prints the kernels whose code differs (both built with the same -D defines). ``--all`` builds
every module define set the selection can produce (define_sets(): every dtype and index width of each entry, every
tensor-core tile with each ring depth, the depthwise strip widths and a spread of 'planes' builds) and prints one
line per (entry, defines, kernel). Needs nvcc (CUDA 13's, as CI has); the hashes are nvcc's, the runtime compiles
with NVRTC (scripts/nvrtc_regs.py).
"""
from __future__ import annotations

import concurrent.futures
import hashlib
import os
import struct
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)


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


def _nvcc() -> str:
    nvcc = os.path.join(os.environ.get("CUDA_HOME", "/usr/local/cuda"), "bin", "nvcc")
    return nvcc if os.path.exists(nvcc) else "nvcc"


def _sources(source: str, tmp: str) -> str:
    """The cuda/ folder of git revision ``source``, or the working tree's ("WORKTREE")."""
    if source == "WORKTREE":
        return os.path.join(ROOT, "cuda")
    subprocess.run(f"git -C {ROOT} archive {source} cuda | tar -x -C {tmp}", shell=True, check=True)
    return os.path.join(tmp, "cuda")


def build(cuda: str, entry: str, defines: dict, arch: str, out: str) -> dict[str, str]:
    subprocess.run([_nvcc(), "-cubin", f"-arch={arch}", "-std=c++17", *(f"-D{k}={v}" for k, v in defines.items()),
                    os.path.join(cuda, entry), "-o", out], check=True, capture_output=True)
    with open(out, "rb") as f:
        return text_sections(f.read())


def hashes(entry: str, source: str, defines: list[str], arch: str,
           dtypes: tuple[int, ...] = (0, 1, 2, 3)) -> dict[tuple[int, str], str]:
    """{(PC_DTYPE, kernel): hash} of ``entry`` from git revision ``source`` or the working tree ("WORKTREE")."""
    extra = dict(d[2:].split("=", 1) for d in defines)
    with tempfile.TemporaryDirectory() as tmp:
        cuda = _sources(source, tmp)
        out = {}
        for dt in dtypes:
            got = build(cuda, entry, {"PC_DTYPE": dt, "PC_INDEX64": 0, **extra}, arch, os.path.join(tmp, "k.cubin"))
            out.update({(dt, k): v for k, v in got.items()})
        return out


def define_sets() -> list[tuple[str, dict]]:
    """(entry, defines) of every module build the selection can produce (portconv/backends/simt): the base defines
    of each entry, the tensor-core tiles with each ring depth, the depthwise strip widths and 'planes' builds."""
    from portconv.backends.simt import depthwise, igemm

    sets = []
    for dt in range(4):
        for i64 in (0, 1):
            for entry in ("direct.cu", "depthwise.cu", "igemm.cu"):
                sets.append((entry, {"PC_DTYPE": dt, "PC_INDEX64": i64}))
        for v in (depthwise.DW_V_ROW, depthwise.DW_V_WIDE16):
            sets.append(("depthwise.cu", {"PC_DTYPE": dt, "PC_INDEX64": 0, "PC_DW_V": v}))
        for smem, blocks in ((16384, 5), (24576, 6), (49152, 4), (49152, 3), (16384, 3)):
            planes = {"PC_DWP_BYTES": smem, "PC_DWP_MINB": blocks}
            sets.append(("depthwise.cu", {"PC_DTYPE": dt, "PC_INDEX64": 0, **planes}))
        sets.append(("depthwise.cu", {"PC_DTYPE": dt, "PC_INDEX64": 0, "PC_DW_V": depthwise.DW_V_ROW,
                                      "PC_DWP_BYTES": 24576, "PC_DWP_MINB": 6}))
    for dt in (0, 2, 3):
        for bm, bn, wm in igemm.TC_TILES.values():
            tile = {"PC_TENSOR_CORES": 1, "PC_TC_BM": bm, "PC_TC_BN": bn, "PC_TC_WM": wm}
            for ks in sorted({igemm.ring_steps(c) for c in (16, 32, 48, 64)}):
                sets.append(("igemm.cu", {"PC_DTYPE": dt, "PC_INDEX64": 0, **tile, "PC_TC_KS": ks}))
            sets.append(("igemm.cu", {"PC_DTYPE": dt, "PC_INDEX64": 1, **tile, "PC_TC_KS": igemm.RING_STEPS}))
    return sets


def key(entry: str, defines: dict) -> str:
    return entry + "|" + ",".join(f"{k}={v}" for k, v in sorted(defines.items()))


def all_hashes(source: str, arch: str, jobs: int = 2) -> dict[str, str]:
    """{'entry|defines kernel': hash} of every define_sets() build from ``source``."""
    with tempfile.TemporaryDirectory() as tmp:
        cuda = _sources(source, tmp)
        sets = define_sets()

        def one(i: int):
            entry, d = sets[i]
            return key(entry, d), build(cuda, entry, d, arch, os.path.join(tmp, f"k{i}.cubin"))

        out = {}
        with concurrent.futures.ThreadPoolExecutor(jobs) as ex:
            for k, got in ex.map(one, range(len(sets))):
                out.update({f"{k} {name}": v for name, v in got.items()})
        return out


def main(args: list[str]) -> None:
    arch = next((a.split("=", 1)[1] for a in args if a.startswith("--arch=")), "sm_90")
    dtypes = next((tuple(map(int, a.split("=", 1)[1].split(","))) for a in args if a.startswith("--dtypes=")),
                  (0, 1, 2, 3))
    jobs = next((int(a.split("=", 1)[1]) for a in args if a.startswith("--jobs=")), 2)
    defines = [a for a in args if a.startswith("-D")]
    rest = [a for a in args if not a.startswith(("-D", "--"))]
    if "--all" in args:
        got = [all_hashes(s, arch, jobs) for s in rest]
        if len(got) == 1:
            print("\n".join(f"{k} {v}" for k, v in sorted(got[0].items())))
            return
        diff = sorted(k for k in got[0].keys() | got[1].keys() if got[0].get(k) != got[1].get(k))
        print("\n".join(f"differs: {k}" for k in diff) or f"all {len(got[0])} kernel builds identical")
        return
    entry, *sources = rest
    got = [hashes(entry, s, defines, arch, dtypes) for s in sources]
    if len(got) == 1:
        print("\n".join(f"{dt} {k} {v}" for (dt, k), v in sorted(got[0].items())))
    else:
        diff = sorted(k for k in got[0].keys() | got[1].keys() if got[0].get(k) != got[1].get(k))
        print("\n".join(f"differs: PC_DTYPE={dt} {k}" for dt, k in diff) or f"all {len(got[0])} kernels identical")


if __name__ == "__main__":
    main(sys.argv[1:])
