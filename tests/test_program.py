"""Note [programs] on the CPU: ProgramRunner builds once per (call, mask, layouts) and only binds and launches after."""
from __future__ import annotations

from portconv.backends.program import Bind, Buffer, KernelPlan, Launch, Module, Program, ProgramRunner
from portconv.problem import Layout


class Arr:
    """A stand-in tensor: a shape and an address."""

    def __init__(self, shape, addr):
        self.shape, self.addr = tuple(shape), addr


class FakeLoader:
    def __init__(self):
        self.loads, self.runs = [], []

    def key(self, t):
        return None if t is None else (t.shape, t.addr % 16)

    def layout(self, t):
        return None if t is None else Layout(t.shape, (1,) * len(t.shape), t.addr % 16)

    def load(self, program, anchor):
        self.loads.append(program)

        def run(values):
            bound = [(x.kernel, tuple((b.role, getattr(values.get(b.role), "addr", b.role)) for b in x.binds))
                     for x in program.launches]
            self.runs.append(bound)
            return tuple(None if r is None else f"<{r}>" for r in program.outputs)
        return run


def _plans(call, mask, layouts):
    """A builder: a forward of one launch; a backward with a workspace and a dependent finalize per result."""
    mod = Module.of("k.cu", {"PC_DTYPE": 0})
    if call == "forward":
        return (KernelPlan("output", f"fwd over {layouts[0].shape}", (), (Buffer("output", (2,), (1,), "float32",
                                                                                      True),),
                           (Launch(mod, "fwd", (1, 1, 1), (256,), (0,) * 4,
                                   (Bind(0, "input"), Bind(1, "weight"), Bind(2, "output"))),)),)
    plans = []
    for result, on in zip(("grad_input", "grad_weight", "grad_bias"), mask):
        if on:
            ws = Buffer(f"{result}.ws", (8,), (1,), "float32")
            plans.append(KernelPlan(result, result, (), (Buffer(result, (2,), (1,), "float32", True), ws),
                                    (Launch(mod, f"{result}_part", (4, 1, 1), (256,), (0,) * 4,
                                            (Bind(0, "grad_output"), Bind(4, ws.role))),
                                     Launch(mod, "finalize", (1, 1, 1), (256,), (0,) * 4,
                                            (Bind(2, result), Bind(4, ws.role)), dependent=True))))
    return tuple(plans)


def test_one_build_and_load_per_layout_then_only_runs():
    built = []

    def build(call, mask, layouts):
        built.append((call, mask, layouts))
        return _plans(call, mask, layouts)

    loader = FakeLoader()
    runner = ProgramRunner(build, loader)
    x, w = Arr((1, 2, 4), 0x1000), Arr((2, 2, 1), 0x2000)
    assert runner.forward(x, w, None) == "<output>"
    assert runner.forward(Arr((1, 2, 4), 0x3000), w, None) == "<output>"  # another address, same layouts
    assert len(built) == 1 and len(loader.loads) == 1 and len(loader.runs) == 2
    assert loader.runs[1][0][1][0] == ("input", 0x3000)  # the second run bound the second tensor
    runner.forward(Arr((1, 2, 4), 0x3004), w, None)  # misaligned by 4 bytes: a layout of its own
    assert len(built) == 2 and built[1][2][0].misalign == 4


def test_backward_programs_per_mask_in_result_order():
    loader = FakeLoader()
    runner = ProgramRunner(_plans, loader)
    x, w, go = Arr((1, 2, 4), 0x1000), Arr((2, 2, 1), 0x2000), Arr((1, 2, 4), 0x4000)
    assert runner.backward(go, x, w, (True, False, True)) == ("<grad_input>", None, "<grad_bias>")
    assert runner.backward(go, x, w, (False, True, False)) == (None, "<grad_weight>", None)
    assert runner.backward(go, x, w, (False, False, False)) == (None, None, None)
    assert len(loader.loads) == 2
    first = loader.loads[0]
    assert [x.kernel for x in first.launches] == ["grad_input_part", "finalize", "grad_bias_part", "finalize"]
    assert [b.role for b in first.buffers] == ["grad_input", "grad_input.ws", "grad_bias", "grad_bias.ws"]
    assert first.launches[1].dependent and not first.launches[0].dependent


def test_program_of_concatenates_plans():
    plans = _plans("backward", (True, True, True), ())
    prog = Program.of(plans, ("grad_input", "grad_weight", "grad_bias"))
    assert len(prog.launches) == 6 and len(prog.buffers) == 6
    assert Module.of("k.cu", {"B": 2, "A": 1}).defines == (("A", "1"), ("B", "2"))
    assert Module.of("x.cl", {"DW_CPU": ""}).describe() == "x.cl DW_CPU"
