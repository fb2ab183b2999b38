"""Recorded launches for the cuda and hip backends' hot path (Note [replayed launches]).

Note [replayed launches]
A cached plan's call is always the same list of kernel launches: the same kernels, grids and argument blocks,
except for the device addresses of the tensors and of the outputs and workspaces the call allocates. The first
call of a plan and direction (for given tensor strides) runs the ordinary launch code once while a Recording
watches: every allocation gets a role ('alloc0', ...), every argument block remembers which of its five pointer
fields holds which role (matched by object identity, never by address), and every launch is kept as
(kernel, grid, block, argument block). Later calls replay it: allocate the outputs and workspaces again, copy each
argument block, patch its pointer fields with this call's addresses, and launch on the caller's current stream.
A call the Recording cannot describe (an argument that is neither an input nor an allocation of the call) is
never replayed: that plan keeps the ordinary path. Kernel-variant knobs (PORTCONV_CUDA_DEPTHWISE, ..._TILE,
PORTCONV_CUDA_IGEMM_TC_TILE) are therefore read when a plan's direction is first recorded: a new plan sees a change.
On CUDA the launch goes straight to the driver
(cuLaunchKernel through ctypes, about 2 us instead of CuPy's 7 us measured on an H100; the argument block is the
kernel's only parameter and the driver copies it at launch); CuPy for ROCm launches through CuPy.

Note [dependent launch]
A split reduction is two kernels: the partial sums, then portconv_split_finalize. Its finalize is recorded as a
dependent step, and on a GPU of compute capability 9.0 or newer the replay launches it with cuLaunchKernelEx and
programmatic stream serialization (PDL): the GPU may start it before the kernel before it has finished, and it
waits inside (pc_grid_dependency_wait, griddepcontrol.wait in cuda/prelude.cuh) until that kernel has completed and
its writes are visible. Nothing is read before the wait, and the kernel waited for started only after everything
before it in the stream, so the order of every memory access is the ordinary one; what goes is the gap between the
two kernels. PORTCONV_CUDA_PDL=0 (read when the driver is first loaded), an older GPU or a driver without
cuLaunchKernelEx: the ordinary launch. The first call of a plan (CuPy's launch) is never a dependent launch.
"""
from __future__ import annotations

import ctypes
import dataclasses
import threading

from .. import knobs

POINTER_FIELDS = 5  # x, w, y, b, ws: the first five int64 fields of the argument block (cuda/common.cuh)

_CUDA_ERROR_INVALID_CONTEXT = 201
_CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION = 6
PDL_ENV = "PORTCONV_CUDA_PDL"


class _LaunchAttribute(ctypes.Structure):  # CUlaunchAttribute: an id, padding, a 64-byte value union
    _fields_ = [("id", ctypes.c_int), ("pad", ctypes.c_char * 4), ("value", ctypes.c_int * 16)]


class _LaunchConfig(ctypes.Structure):  # CUlaunchConfig
    _fields_ = [("grid", ctypes.c_uint * 3), ("block", ctypes.c_uint * 3), ("shared", ctypes.c_uint),
                ("stream", ctypes.c_void_p), ("attrs", ctypes.POINTER(_LaunchAttribute)), ("count", ctypes.c_uint)]
_driver = None
_driver_lock = threading.Lock()


class DriverLaunch:
    """cuLaunchKernel from libcuda, for kernels whose one parameter is the argument block."""

    def __init__(self):
        lib = ctypes.CDLL("libcuda.so.1")
        self._launch = lib.cuLaunchKernel
        self._launch.argtypes = [ctypes.c_void_p] + [ctypes.c_uint] * 6 + [ctypes.c_uint, ctypes.c_void_p,
                                                                            ctypes.c_void_p, ctypes.c_void_p]
        self._launch.restype = ctypes.c_int
        self._name = lib.cuGetErrorName
        self._name.argtypes = [ctypes.c_int, ctypes.POINTER(ctypes.c_char_p)]
        # Note [dependent launch]: cuLaunchKernelEx (CUDA 12.0 drivers and newer); the caller checks the GPU (sm_90+)
        self._launch_ex = getattr(lib, "cuLaunchKernelEx", None) if knobs.get(PDL_ENV, "1") != "0" else None
        if self._launch_ex is not None:
            self._launch_ex.argtypes = [ctypes.POINTER(_LaunchConfig), ctypes.c_void_p, ctypes.c_void_p,
                                        ctypes.c_void_p]
            self._launch_ex.restype = ctypes.c_int
        self.pdl = self._launch_ex is not None  # scripts may switch it off (A/B timing in one process)

    @staticmethod
    def head_ex(fn_ptr: int, grid, block: int) -> tuple:
        """cuLaunchKernelEx's configuration of a dependent launch (its stream set at each call) and function."""
        attr = _LaunchAttribute(_CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION)
        attr.value[0] = 1  # programmaticStreamSerializationAllowed
        cfg = _LaunchConfig((ctypes.c_uint * 3)(*grid), (ctypes.c_uint * 3)(block, 1, 1), 0, None,
                            ctypes.pointer(attr), 1)
        return "ex", cfg, attr, ctypes.c_void_p(fn_ptr)

    @staticmethod
    def head(fn_ptr: int, grid, block: int) -> tuple:
        """cuLaunchKernel's leading arguments (function, grid, block, no dynamic shared memory) as ctypes values,
        converted once per recorded launch instead of at every call."""
        u = ctypes.c_uint
        return ctypes.c_void_p(fn_ptr), u(grid[0]), u(grid[1]), u(grid[2]), u(block), u(1), u(1), u(0)

    def _go(self, head: tuple, stream: int, pp) -> int:
        if head[0] == "ex":
            head[1].stream = stream
            return self._launch_ex(ctypes.byref(head[1]), head[3], pp, None)
        return self._launch(*head, stream, pp, None)

    def __call__(self, head: tuple, block_args, stream: int, device: int) -> None:
        """Launch with ``head`` (head() or, for a dependent launch, head_ex())."""
        pp = ctypes.byref(ctypes.c_void_p(ctypes.addressof(block_args)))
        err = self._go(head, stream, pp)
        if err == _CUDA_ERROR_INVALID_CONTEXT:  # a thread that never made the device's context current
            import cupy

            cupy.cuda.runtime.setDevice(device)
            err = self._go(head, stream, pp)
        if err:
            name = ctypes.c_char_p()
            self._name(err, ctypes.byref(name))
            what = "cuLaunchKernelEx (Note [dependent launch])" if head[0] == "ex" else "cuLaunchKernel"
            raise RuntimeError(f"{what} failed: {(name.value or b'?').decode()} ({err})")


def driver_launch() -> DriverLaunch | None:
    """The CUDA driver's launch, or None where libcuda cannot be loaded."""
    global _driver
    if _driver is None:
        with _driver_lock:
            if _driver is None:
                try:
                    _driver = DriverLaunch()
                except (OSError, AttributeError):
                    _driver = False
    return _driver or None


@dataclasses.dataclass
class Step:
    fn: object  # CuPy Function
    grid: tuple[int, int, int]
    block: int
    args: ctypes.Array  # the argument block as recorded (c_int64 * ARG_COUNT)
    slots: tuple[tuple[int, str], ...]  # (pointer field, role)
    head: tuple | None = None  # DriverLaunch.head of this launch, made at its first replay
    dependent: bool = False  # Note [dependent launch]: it waits for the launch before it (a split finalize)


class Recording:
    """What one ordinary call did, as roles: see Note [replayed launches]."""

    def __init__(self, inputs: dict[str, object]):
        self.roles = {id(t): r for r, t in inputs.items() if t is not None}
        self.keep = list(inputs.values())  # ids stay valid while recording
        self.allocs: list[tuple[str, str, tuple]] = []  # (role, 'empty' | 'workspace', arguments)
        self.steps: list[Step] = []
        self.pending: dict[int, tuple] = {}
        self.ok = True

    def allocated(self, obj, kind: str, args: tuple):
        role = f"alloc{len(self.allocs)}"
        self.allocs.append((role, kind, args))
        self.roles[id(obj)] = role
        self.keep.append(obj)
        return obj

    def argument_block(self, args, tensors) -> None:
        """``args`` (an argument block about to be launched) holds ``tensors`` in its pointer fields."""
        slots = []
        for i, t in enumerate(tensors):
            if t is None:
                continue
            role = self.roles.get(id(t))
            if role is None:
                self.ok = False
            else:
                slots.append((i, role))
        self.pending[id(args)] = (args, tuple(slots))

    def launched(self, fn, grid, block: int, args, dependent: bool = False) -> None:
        got = self.pending.get(id(args))
        if got is None or got[0] is not args:  # a block not built by the recorded argument builder
            self.ok = False
            return
        raw = args.tobytes()
        block_args = (ctypes.c_int64 * (len(raw) // 8)).from_buffer_copy(raw)
        self.steps.append(Step(fn, tuple(int(g) for g in grid), int(block), block_args, got[1],
                               dependent=dependent and bool(self.steps)))

    def program(self, outputs: tuple) -> Program | None:
        """The replayable program, or None when the call was not fully described."""
        roles = []
        for o in outputs:
            if o is None:
                roles.append(None)
                continue
            role = self.roles.get(id(o))
            if role is None:
                return None
            roles.append(role)
        return Program(tuple(self.allocs), tuple(self.steps), tuple(roles)) if self.ok else None


@dataclasses.dataclass(frozen=True)
class Program:
    allocs: tuple[tuple[str, str, tuple], ...]
    steps: tuple[Step, ...]
    outputs: tuple[str | None, ...]

    def run(self, io, inputs: dict[str, object], poison: bool) -> tuple:
        vals = dict(inputs)
        for role, kind, args in self.allocs:
            vals[role] = io.empty(*args, poison) if kind == "empty" else io.workspace(*args)
        ptr = io.ptr_of
        stream = io.raw_stream()
        for s in self.steps:
            a = type(s.args).from_buffer_copy(s.args)
            for i, role in s.slots:
                a[i] = ptr(vals[role])
            if s.head is None:
                s.head = io.launch_head(s.fn, s.grid, s.block, s.dependent)
            io.launch_block(s.fn, s.grid, s.block, a, stream, s.head)
        return tuple(None if r is None else vals[r] for r in self.outputs)
