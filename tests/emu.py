"""The CPU emulator's tensors stand-in, shared by the cuda and hip emulator tests (tests/cuda_emu)."""
from __future__ import annotations

import ctypes
import pathlib
import subprocess

import torch

from portconv.backends._cupy import Tensors, inline_source

EMU_DIR = pathlib.Path(__file__).resolve().parent / "cuda_emu"
CUDA_DIR = pathlib.Path(__file__).resolve().parents[1] / "cuda"


class EmuKernels:
    """KernelSet stand-in: the cuda bodies built once per (entry, defines) with g++ against the CPU emulator
    prelude; ``warp`` forces PC_WARP_SIZE (the hip tests' wave64)."""

    def __init__(self, tmp: pathlib.Path, warp: int | None = None):
        self.tmp, self.warp, self.libs = tmp, warp, {}

    def function(self, entry, defines, device, name):
        key = (entry, tuple(sorted(defines.items())))
        if key not in self.libs:
            src = inline_source(entry, [EMU_DIR, CUDA_DIR]) + "\n" + inline_source("launch.cuh", [EMU_DIR])
            stem = f"{pathlib.Path(entry).stem}-{'-'.join(f'{k}{v}' for k, v in key[1])}-w{self.warp}"
            (self.tmp / f"{stem}.cpp").write_text(src)
            so = self.tmp / f"{stem}.so"
            warp = [] if self.warp is None else [f"-DPC_WARP_SIZE={self.warp}"]
            # -fno-gnu-unique: a function-local static (the emulator's __shared__) of an inline function is
            # otherwise one object per process, bound to the first library loaded, whatever this build's size
            cmd = ["g++", "-std=c++20", "-O1", "-shared", "-fPIC", "-fno-gnu-unique", "-w", *warp,
                   *(f"-D{k}={v}" for k, v in defines.items()), str(self.tmp / f"{stem}.cpp"), "-o", str(so)]
            r = subprocess.run(cmd, capture_output=True, text=True)
            assert r.returncode == 0, r.stderr[-4000:]
            self.libs[key] = ctypes.CDLL(str(so))
        lib = self.libs[key]
        return lib, ctypes.cast(getattr(lib, name), ctypes.c_void_p).value


class EmuTensors:
    """Tensors stand-in: torch CPU tensors, launches run by the emulator (recorded and replayed like the GPU's,
    Note [replayed launches])."""

    device = 0
    ptr = ptr_of = staticmethod(Tensors.ptr)
    replayable = True

    def __init__(self, wave: int = 1):
        self.rec, self.wave = None, wave

    def empty(self, shape, strides, dtype, poison=False):
        t = torch.empty_strided(tuple(shape), tuple(strides), dtype=getattr(torch, dtype))
        t = t.fill_(float("nan")) if poison else t
        return t if self.rec is None else self.rec.allocated(t, "empty", (shape, strides, dtype))

    def workspace(self, count, double):
        t = torch.full((count,), float("nan"), dtype=torch.float64 if double else torch.float32)
        return t if self.rec is None else self.rec.allocated(t, "workspace", (count, double))

    def launch(self, fn, grid, block, args, dependent=False):
        self._run(fn, grid, block, args.ctypes.data)
        if self.rec is not None:
            self.rec.launched(fn, grid, block, args, dependent)

    def raw_stream(self):
        return 0

    def launch_head(self, fn, grid, block, dependent=False):
        return None

    def launch_block(self, fn, grid, block, block_args, stream, head=None):
        self._run(fn, grid, block, ctypes.addressof(block_args))

    def _run(self, fn, grid, block, address):
        assert block % self.wave == 0, f"wave{self.wave} needs blocks of whole waves"
        lib, ptr = fn
        rc = lib.pc_emu_launch(ctypes.c_void_p(ptr), *[ctypes.c_uint(g) for g in grid], ctypes.c_uint(block),
                               ctypes.c_void_p(address))
        assert rc == 0, "the emulated kernel deadlocked at a barrier"
