"""Note [replayed launches] on the CPU: what a Recording keeps and how a Program patches and launches (fake device).

The GPU side (driver launches, real kernels, replay == ordinary results) is tests/test_cuda.py's."""
from __future__ import annotations

import ctypes

import numpy as np

from portconv.backends._replay import Recording


class Obj:
    """A stand-in tensor with an address."""

    def __init__(self, addr: int):
        self.addr = addr


class FakeIo:
    def __init__(self):
        self.next, self.launches, self.allocs, self.heads = 0x1000, [], [], []

    @staticmethod
    def ptr(t) -> int:
        return 0 if t is None else t.addr

    ptr_of = ptr

    def launch_head(self, fn, grid, block, dependent=False):
        return ("head", fn, grid, block) + (("dependent",) if dependent else ())

    def raw_stream(self) -> int:
        return 77

    def empty(self, shape, strides, dtype, poison):
        self.allocs.append(("empty", shape, strides, dtype, poison))
        self.next += 0x100
        return Obj(self.next)

    def workspace(self, count, double):
        self.allocs.append(("workspace", count, double))
        self.next += 0x100
        return Obj(self.next)

    def launch_block(self, fn, grid, block, args, stream, head=None):
        assert head[:4] == ("head", fn, grid, block)  # made once per recorded launch, passed at every replay
        self.heads.append(head)
        self.launches.append((fn, grid, block, list(args), stream))


def block(*vals):
    a = np.zeros(8, dtype=np.int64)
    a[: len(vals)] = vals
    return a.view(np.dtype((np.void, 64)))


def record_call(x, w, b):
    """What the ordinary path does: allocate an output and a workspace, build two blocks, launch them."""
    rec = Recording({"input": x, "weight": w, "bias": b})
    y = rec.allocated(Obj(0x9000), "empty", ((2, 3), (3, 1), "float32"))
    ws = rec.allocated(Obj(0x9100), "workspace", (12, False))
    a1 = block(x.addr, w.addr, y.addr, 0 if b is None else b.addr, ws.addr, 5, 6)
    rec.argument_block(a1, (x, w, y, b, ws))
    rec.launched("main", (4, 1, 1), 256, a1)
    a2 = block(0, y.addr, 0, 0, ws.addr, 9)
    rec.argument_block(a2, (None, y, None, None, ws))
    rec.launched("finalize", (1, 1, 1), 256, a2, dependent=True)
    return rec, y


def test_program_replays_with_this_calls_addresses():
    x, w = Obj(0x100), Obj(0x200)
    rec, y = record_call(x, w, None)
    prog = rec.program((y,))
    assert prog is not None and prog.outputs == ("alloc0",)
    io = FakeIo()
    x2, w2 = Obj(0x500), Obj(0x600)
    (out,) = prog.run(io, {"input": x2, "weight": w2, "bias": None}, poison=True)
    assert io.allocs == [("empty", (2, 3), (3, 1), "float32", True), ("workspace", 12, False)]
    (f1, g1, b1, a1, s1), (f2, g2, b2, a2, s2) = io.launches
    ws = 0x1200  # the second allocation
    assert (f1, g1, b1, s1) == ("main", (4, 1, 1), 256, 77)
    assert a1 == [0x500, 0x600, out.addr, 0, ws, 5, 6, 0]  # pointers patched, the rest as recorded
    assert (f2, g2) == ("finalize", (1, 1, 1)) and a2 == [0, out.addr, 0, 0, ws, 9, 0, 0]
    # the recorded blocks are templates: a replay never changes them
    again = FakeIo()
    prog.run(again, {"input": Obj(0x700), "weight": Obj(0x800), "bias": None}, poison=False)
    assert again.launches[0][3][:2] == [0x700, 0x800] and io.launches[0][3][:2] == [0x500, 0x600]


def test_bias_role_is_patched_too():
    x, w, b = Obj(0x100), Obj(0x200), Obj(0x300)
    rec, y = record_call(x, w, b)
    io = FakeIo()
    rec.program((y,)).run(io, {"input": x, "weight": w, "bias": Obj(0x4440)}, poison=False)
    assert io.launches[0][3][3] == 0x4440


def test_a_tensor_that_is_no_role_makes_no_program():
    x, w = Obj(0x100), Obj(0x200)
    rec = Recording({"input": x, "weight": w})
    y = rec.allocated(Obj(0x900), "empty", ((1,), (1,), "float32"))
    stranger = Obj(0x200)  # same address as the weight, but not the weight: identity decides, never addresses
    a = block(x.addr, stranger.addr, y.addr)
    rec.argument_block(a, (x, stranger, y, None, None))
    rec.launched("k", (1, 1, 1), 32, a)
    assert rec.program((y,)) is None


def test_a_block_not_built_by_the_recorder_makes_no_program():
    x, w = Obj(0x100), Obj(0x200)
    rec = Recording({"input": x, "weight": w})
    y = rec.allocated(Obj(0x900), "empty", ((1,), (1,), "float32"))
    rec.launched("k", (1, 1, 1), 32, block(x.addr, w.addr, y.addr))
    assert rec.program((y,)) is None


def test_an_output_that_was_not_allocated_in_the_call_makes_no_program():
    x, w = Obj(0x100), Obj(0x200)
    rec = Recording({"input": x, "weight": w})
    assert rec.program((Obj(0x900),)) is None
    assert rec.program((None,)) is not None  # nothing to return, nothing launched: an empty program


def test_blocks_are_ctypes_int64_arrays():
    x, w = Obj(0x100), Obj(0x200)
    rec, y = record_call(x, w, None)
    step = rec.program((y,)).steps[0]
    assert isinstance(step.args, ctypes.Array) and ctypes.sizeof(step.args) == 64


def test_the_finalize_is_replayed_as_a_dependent_launch():
    """Note [dependent launch]: the step the ordinary path marks dependent asks launch_head for a dependent launch
    (programmatic stream serialization on sm_90+); the first step of a call never does (nothing before it is its)."""
    x, w = Obj(0x100), Obj(0x200)
    rec, y = record_call(x, w, None)
    prog = rec.program((y,))
    assert [s.dependent for s in prog.steps] == [False, True]
    io = FakeIo()
    prog.run(io, {"input": x, "weight": w, "bias": None}, poison=False)
    assert io.heads == [("head", "main", (4, 1, 1), 256), ("head", "finalize", (1, 1, 1), 256, "dependent")]
    first = Recording({"input": x})
    a = block(x.addr)
    first.argument_block(a, (x,))
    first.launched("k", (1, 1, 1), 32, a, dependent=True)
    assert first.steps[0].dependent is False


def test_launch_config_matches_the_driver_abi():
    """cuLaunchKernelEx's CUlaunchConfig and CUlaunchAttribute as cuda.h lays them out on 64-bit hosts."""
    from portconv.backends._replay import DriverLaunch, _LaunchAttribute, _LaunchConfig

    assert ctypes.sizeof(_LaunchAttribute) == 72 and _LaunchAttribute.value.offset == 8
    assert ctypes.sizeof(_LaunchConfig) == 56
    assert (_LaunchConfig.shared.offset, _LaunchConfig.stream.offset, _LaunchConfig.attrs.offset,
            _LaunchConfig.count.offset) == (24, 32, 40, 48)
    kind, cfg, attr, fn = DriverLaunch.head_ex(0x1234, (7, 2, 1), 256)
    assert kind == "ex" and fn.value == 0x1234 and list(cfg.grid) == [7, 2, 1] and list(cfg.block) == [256, 1, 1]
    assert cfg.count == 1 and cfg.attrs.contents.id == 6 and cfg.attrs.contents.value[0] == 1  # PDL allowed
    assert ctypes.addressof(cfg.attrs.contents) == ctypes.addressof(attr)  # kept alive with the config
