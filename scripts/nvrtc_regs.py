"""Registers, spills and shared memory of portconv's CUDA kernels as NVRTC builds them at run time, without a GPU.

NVRTC's register counts can differ from an offline nvcc build of the same source (docs/kernels/depthwise.md), and
what runs is NVRTC's. This asks libnvrtc (pip install nvidia-cuda-nvrtc; the one portconv's cuda set
loads, Note [ctypes toolchain]) for the ptxas report of one entry, with the options portconv's KernelSet passes.

    python scripts/nvrtc_regs.py depthwise.cu sm_90 PC_DTYPE=3 [PC_DWT_FWIN=1 ...] [--match fwd_tile_s1]
"""
from __future__ import annotations

import os
import re
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from portconv import sources  # noqa: E402
from portconv.backends.simt.compile import inline_source  # noqa: E402


def libnvrtc():
    """portconv's NVRTC (Note [ctypes toolchain]); SystemExit naming what to install where there is none."""
    from portconv.backends.simt import nvidia
    from portconv.errors import VendorImportError

    try:
        return nvidia.nvrtc()
    except VendorImportError as e:
        raise SystemExit(str(e)) from e


def compile_text(text: str, name: str, options: list[str]) -> tuple[int, str]:
    """(NVRTC's return code, its log with ptxas's resource lines) of building ``text`` with ``options``."""
    rc, log, _ = libnvrtc().compile(text, name, [*options, "--ptxas-options=-v"])
    return rc, log


def report(entry: str, arch: str, defines: dict[str, str]) -> str:
    text = inline_source(entry, [sources.folder("cuda")])
    rc, out = compile_text(text, entry, ["-std=c++17", f"-arch={arch}",
                                         *(f"-D{k}={v}" for k, v in sorted(defines.items()))])
    if rc:
        raise SystemExit(f"nvrtc failed ({rc}):\n{out}")
    return out


def summary(log: str, match: str = "") -> list[str]:
    """One line per entry function: registers, spill bytes, shared memory."""
    rows, name = [], None
    for line in log.splitlines():
        m = re.search(r"Compiling entry function '(\w+)'", line)
        if m:
            name = m.group(1)
        m = re.search(r"(\d+) bytes spill stores", line)
        if m and name:
            spill = m.group(1)
        m = re.search(r"Used (\d+) registers(?:.*?(\d+) bytes smem)?", line)  # no smem: no "bytes smem"
        if m and name and match in name:
            rows.append(f"{name}: {m.group(1)} registers, {spill} bytes spilled, {m.group(2) or 0} bytes smem")
    return rows


if __name__ == "__main__":
    args = [a for a in sys.argv[1:] if not a.startswith("--match")]
    match = next((a.split("=", 1)[1] for a in sys.argv[1:] if a.startswith("--match=")), "")
    entry, arch, defs = args[0], args[1], dict(a.split("=", 1) for a in args[2:])
    defs.setdefault("PC_INDEX64", "0")
    print("\n".join(summary(report(entry, arch, defs), match)))
