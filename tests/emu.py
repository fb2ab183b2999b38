"""The CPU emulator's Loader, shared by the cuda and hip emulator tests: the simt set's Programs on torch CPU tensors,
their kernels built from the cuda/ bodies with g++ against tests/cuda_emu and launched by pc_emu_launch."""
from __future__ import annotations

import ctypes
import pathlib
import subprocess

import torch

from portconv.backends.program import Program
from portconv.backends.simt.compile import inline_source
from portconv.backends.simt.runtime import Executable
from portconv.backends.simt.view import ARG_COUNT
from portconv.problem import Layout

EMU_DIR = pathlib.Path(__file__).resolve().parent / "cuda_emu"
CUDA_DIR = pathlib.Path(__file__).resolve().parents[1] / "cuda"
_BLOCK = ctypes.c_int64 * ARG_COUNT


class EmuKernels:
    """KernelSet stand-in: the cuda bodies of a Module (a hip/ entry builds its cuda/ twin) built once per
    (entry, defines) with g++ against the CPU emulator prelude; ``warp`` forces PC_WARP_SIZE (the hip tests' wave64);
    ``extra``: defines added to every build (the tile kernels' compile-time switches)."""

    def __init__(self, tmp: pathlib.Path, warp: int | None = None, extra: dict | None = None):
        self.tmp, self.warp, self.extra, self.libs = tmp, warp, dict(extra or {}), {}

    def function(self, module, device, name):
        entry = pathlib.Path(module.source).stem + ".cu"
        defines = {**dict(module.defines), **{k: str(v) for k, v in self.extra.items()}}
        key = (entry, tuple(sorted(defines.items())))
        if key not in self.libs:
            src = inline_source(entry, [EMU_DIR, CUDA_DIR]) + "\n" + inline_source("launch.cuh", [EMU_DIR])
            stem = f"{pathlib.Path(entry).stem}-{'-'.join(f'{k}{v}' for k, v in key[1])}-w{self.warp}"
            (self.tmp / f"{stem}.cpp").write_text(src)
            so = self.tmp / f"{stem}.so"
            warp = [] if self.warp is None else [f"-DPC_WARP_SIZE={self.warp}"]
            # -fno-gnu-unique: a function-local static (the emulator's __shared__) of an inline function is
            # otherwise one object per process, bound to the first library loaded, whatever this build's size.
            # -O0: the emulator tests are bound by these builds, not by their runs (their emulated problems are
            # small)
            cmd = ["g++", "-std=c++20", "-O0", "-shared", "-fPIC", "-fno-gnu-unique", "-w", *warp,
                   *(f"-D{k}={v}" for k, v in defines.items()), str(self.tmp / f"{stem}.cpp"), "-o", str(so)]
            r = subprocess.run(cmd, capture_output=True, text=True)
            assert r.returncode == 0, r.stderr[-4000:]
            self.libs[key] = ctypes.CDLL(str(so))
        lib = self.libs[key]
        return lib, ctypes.cast(getattr(lib, name), ctypes.c_void_p).value


class EmuLoader:
    """program.Loader on the CPU: every Program it loads is kept (``programs``), its buffers are torch CPU tensors
    (results NaN-poisoned under PORTCONV_POISON, workspaces and staging copies always NaN: an unwritten read shows),
    its launches run through the same Executable as the GPU's, the emulator's pc_emu_launch in place of the driver.
    ``native``: its plans get the native executor (Note [native executor]), whose Executables launch the same way."""

    def __init__(self, kernels: EmuKernels, wave: int = 1, native: bool = False):
        self.kernels, self.wave, self.supports_native = kernels, wave, native
        self.programs: list[Program] = []

    def key(self, t) -> tuple | None:
        return None if t is None else (t.stride(), t.data_ptr() & 15)

    def layout(self, t) -> Layout | None:
        if t is None:
            return None
        return Layout(tuple(t.shape), t.stride(), t.data_ptr() & 15)

    def prefetch(self, program: Program, anchor) -> None:
        """The emulator builds a module when first loaded (Note [compile ahead])."""

    def load(self, program: Program, anchor) -> Executable:
        self.programs.append(program)
        steps = []
        for x in program.launches:
            assert x.block[0] % self.wave == 0, f"wave{self.wave} needs blocks of whole waves"
            lib, fn = self.kernels.function(x.module, 0, x.kernel)
            steps.append((_BLOCK(*x.args), tuple((b.slot, b.role) for b in x.binds), (lib, fn, x.grid, x.block)))
        allocs = tuple((b.role, self._alloc(b), b.result) for b in program.buffers)
        return Executable(allocs, steps, program.outputs, lambda t: t.data_ptr(), lambda: 0, self._go)

    def load_native(self, program: Program, anchor, poison: bool):
        from portconv import native
        from portconv.backends.simt.runtime import native_parts

        self.programs.append(program)

        def launch_of(x):
            lib, fn = self.kernels.function(x.module, 0, x.kernel)
            return fn, 2, ctypes.cast(lib.pc_emu_launch, ctypes.c_void_p).value
        parts = native_parts(program, launch_of, always_nan=True)
        return native.executable(-1, 0, *parts, (0, 0, 0, 0, 0), poison, lambda who: None)

    @staticmethod
    def _alloc(b):
        dtype = getattr(torch, b.dtype)

        def alloc(poison: bool):
            t = torch.empty_strided(b.shape, b.strides, dtype=dtype)
            return t.fill_(float("nan")) if poison or not b.result else t
        return alloc

    @staticmethod
    def _go(launches, stream) -> None:
        for (lib, fn, grid, block), block_args in launches:
            rc = lib.pc_emu_launch(ctypes.c_void_p(fn), *[ctypes.c_uint(g) for g in grid], ctypes.c_uint(block[0]),
                                   ctypes.c_void_p(ctypes.addressof(block_args)))
            assert rc == 0, "the emulated kernel deadlocked at a barrier"

    def launches(self) -> list:
        """Every launch of every Program loaded so far, in order."""
        return [x for p in self.programs for x in p.launches]
