"""KernelPlan and Program: what a plan runs, as data; ProgramRunner: the one way the own kernel sets run it.

Note [programs]
A plan's call (its forward, or its backward for one output mask) is always the same kernel launches: the same
modules, kernels, grids and argument blocks; only the tensors' addresses (and, on OpenCL, their element offsets)
differ between calls. So the own kernel sets (cuda/hip, opencl) describe a call as data, made by a pure function of
(problem, device, options, the operands' Layouts):
  - a KernelPlan per result (forward, grad_input, grad_weight, grad_bias): what runs and why, in explain()'s words,
    and its Program part: the Buffers it allocates and the Launches it makes;
  - each Launch names its module (source file + defines), kernel, grid, block, the argument block with every
    address field zero, and Binds: which argument slot takes which role's address (and offset).
Roles are the call's operands ('input', 'weight', 'bias', 'grad_output'), its results ('output', 'grad_input',
'grad_weight', 'grad_bias') and the Buffers' own names. ProgramRunner keeps one executable per (call, operand
layouts): the first call of a layout asks the builder (pure) and the vendor's loader (compiles, fetches kernels),
every call then binds addresses and launches; nothing is decided at launch. The plan holds the KernelPlans of the
layouts the problem implies (inputs as described, grad_output dense in the result format, aligned addresses);
explain() prints those.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Callable, Hashable
from typing import Protocol

from ..problem import Layout

RESULTS = ("output", "grad_input", "grad_weight", "grad_bias")  # the KernelPlan directions, in call order
OPERANDS = ("input", "weight", "bias", "grad_output")


@dataclasses.dataclass(frozen=True)
class Module:
    """A compiled unit: a kernel source file and its compile-time defines ((name, value); value '' for a flag).

    ``kernel``: the one entry the unit holds ('' for every entry of the source). Note [one kernel a module]: the CUDA
    and HIP sets compile each launched kernel alone (PC_ONLY, PC_ONLY_<kernel>: every other entry is preprocessed
    away), so a plan compiles what it launches, not every variant of its family."""

    source: str
    defines: tuple[tuple[str, str], ...] = ()
    kernel: str = ""

    @classmethod
    def of(cls, source: str, defines: dict | None = None, kernel: str = "") -> Module:
        return cls(source, tuple(sorted((k, str(v)) for k, v in (defines or {}).items())), kernel)

    def compile_defines(self) -> tuple[tuple[str, str], ...]:
        """The defines the compiler gets: ``defines``, and the PC_ONLY pair where the unit holds one kernel."""
        return self.defines + ((("PC_ONLY", ""), (f"PC_ONLY_{self.kernel}", "")) if self.kernel else ())

    def describe(self) -> str:
        """The source and its defines (the kernel, where the unit holds one, is named by the launch beside it)."""
        return self.source + "".join(f" {k}={v}" if v != "" else f" {k}" for k, v in self.defines)


@dataclasses.dataclass(frozen=True)
class Bind:
    """Argument ``slot`` takes ``role``'s address (CUDA: a pointer field of the argument block; OpenCL: a kernel
    argument); ``offset_slot`` >= 0: that field of the argument block takes its element offset (OpenCL)."""

    slot: int
    role: str
    offset_slot: int = -1


@dataclasses.dataclass(frozen=True)
class Buffer:
    """Memory a call allocates: a result (poisoned under PORTCONV_POISON) or a workspace."""

    role: str
    shape: tuple[int, ...]
    strides: tuple[int, ...]
    dtype: str
    result: bool = False


@dataclasses.dataclass(frozen=True)
class Launch:
    module: Module
    kernel: str
    grid: tuple[int, ...]  # CUDA: blocks; OpenCL: the global size (a multiple of block)
    block: tuple[int, ...]  # CUDA: threads; OpenCL: the work-group size
    args: tuple[int, ...]  # the argument block, address (and offset) fields zero
    binds: tuple[Bind, ...]
    dependent: bool = False  # Note [dependent launch]: may start before the launch before it completes
    local_bytes: int = 0  # OpenCL: local memory passed as the last argument

    def describe(self) -> str:
        return f"{self.kernel} grid {'x'.join(map(str, self.grid))} block {'x'.join(map(str, self.block))}"


@dataclasses.dataclass(frozen=True)
class KernelPlan:
    """What one result of a plan's call runs and why: explain()'s lines, and the buffers and launches."""

    result: str  # RESULTS
    summary: str  # one line: the kernels and their main parameters
    decisions: tuple[str, ...] = ()  # one line per further decision
    buffers: tuple[Buffer, ...] = ()
    launches: tuple[Launch, ...] = ()

    def lines(self) -> list[str]:
        return [self.summary, *self.decisions]


@dataclasses.dataclass(frozen=True)
class Program:
    """The launches of one call, in order, with the buffers they need and the roles the call returns."""

    buffers: tuple[Buffer, ...]
    launches: tuple[Launch, ...]
    outputs: tuple[str | None, ...]

    @classmethod
    def of(cls, plans: tuple[KernelPlan, ...], outputs: tuple[str | None, ...]) -> Program:
        return cls(tuple(b for p in plans for b in p.buffers), tuple(x for p in plans for x in p.launches), outputs)


class Loader(Protocol):
    """A vendor's side of ProgramRunner: a cheap key of what an operand's layout depends on (read every call), the
    layout itself (read once per key), and a Program made executable."""

    def key(self, t) -> Hashable: ...

    def layout(self, t) -> Layout | None: ...

    def load(self, program: Program, anchor) -> Callable[[dict], tuple]: ...

    def prefetch(self, program: Program, anchor) -> None:
        """Start making the program's kernels ready for the device of ``anchor`` (Note [compile ahead]); loaders
        whose kernels need no compile ahead do nothing."""


Builder = Callable[[str, tuple, tuple], tuple[KernelPlan, ...]]  # (call, mask or (), layouts) -> KernelPlans


def backward_outputs(mask) -> tuple[str | None, ...]:
    return tuple(r if m else None for r, m in zip(RESULTS[1:], mask))


def _plain(t):
    """``t`` with a torch view's negative bit applied (kernels read memory, not view flags: torch._neg_view and
    conj().imag-style views would otherwise be read un-negated)."""
    is_neg = getattr(t, "is_neg", None)
    return t.resolve_neg() if is_neg is not None and is_neg() else t


class ProgramRunner:
    """Runs a plan's calls: one executable per (call, mask, operand layouts), built on its first call. ``ahead``:
    the plan's KernelPlans, whose kernels the first call hands to loader.prefetch (Note [compile ahead]).
    ``native``: the native executor's Runner of this plan once it has one (Note [native executor]), which then runs
    every call; ``native_poison``: PORTCONV_POISON as the plan was offered to it."""

    native = None
    native_poison = False

    def __init__(self, build: Builder, loader: Loader, ahead: tuple[KernelPlan, ...] = ()):
        self.build, self.loader = build, loader
        self._ahead = Program.of(ahead, ()) if ahead else None
        self._forward: dict[tuple, Callable] = {}
        self._backward: dict[tuple, Callable] = {}

    @property
    def supports_native(self) -> bool:
        return getattr(self.loader, "supports_native", False)

    def _program(self, call: str, mask: tuple, operands: tuple) -> Program:
        """The Program of a call's operands ((input, weight, bias) or (grad_output, input, weight)); the first one
        hands the plan's kernels to loader.prefetch (Note [compile ahead]). The anchor is the input."""
        lay = self.loader.layout
        program = Program.of(self.build(call, mask, tuple(lay(t) for t in operands)),
                             ("output",) if call == "forward" else backward_outputs(mask))
        if self._ahead is not None:
            ahead, self._ahead = self._ahead, None
            self.loader.prefetch(ahead, operands[0] if call == "forward" else operands[1])
        return program

    def native_executable(self, call: str, mask: tuple, operands: tuple):
        """The native Executable of a call's operands, as the native Runner passes them (negative views resolved,
        the bias in the input's dtype): the Program the Python path would load."""
        anchor = operands[0] if call == "forward" else operands[1]
        return self.loader.load_native(self._program(call, mask, operands), anchor, self.native_poison)

    def forward(self, input, weight, bias):
        if self.native is not None:
            return self.native.forward(input, weight, bias)
        input, weight, bias = _plain(input), _plain(weight), _plain(bias)
        if bias is not None and bias.dtype != input.dtype:  # Note [slow kernels' bias dtype] (validate.py)
            bias = bias.to(input.dtype)
        k = self.loader.key
        key = (k(input), k(weight), k(bias))
        run = self._forward.get(key)
        if run is None:
            run = self._forward[key] = self.loader.load(self._program("forward", (), (input, weight, bias)), input)
        return run({"input": input, "weight": weight, "bias": bias})[0]

    def backward(self, grad_output, input, weight, mask):
        if not any(mask):
            return None, None, None
        if self.native is not None:
            return self.native.backward(grad_output, input, weight, mask)
        grad_output, input, weight = _plain(grad_output), _plain(input), _plain(weight)
        k = self.loader.key
        key = (mask, k(grad_output), k(input), k(weight))
        run = self._backward.get(key)
        if run is None:
            program = self._program("backward", mask, (grad_output, input, weight))
            run = self._backward[key] = self.loader.load(program, input)
        return run({"grad_output": grad_output, "input": input, "weight": weight})


class EmptyRunner:
    """The Runner of an empty problem (ATen's Empty backend: a batch or channel count of zero): no kernel runs, the
    results are what PyTorch returns (validate.empty_forward / empty_backward)."""

    native = None

    def __init__(self, problem):
        self.problem = problem

    def forward(self, input, weight, bias):
        from ..validate import empty_forward

        return empty_forward(input, weight, bias, self.problem.params)

    def backward(self, grad_output, input, weight, mask):
        from ..validate import empty_backward

        return empty_backward(grad_output, input, weight, self.problem.params, mask)


def empty_kernels(problem) -> tuple[KernelPlan, ...]:
    """The KernelPlans of an empty problem: no kernel, PyTorch's empty results."""
    results = RESULTS if problem.has_bias else RESULTS[:3]
    return tuple(KernelPlan(r, "no kernel: an empty problem (PyTorch's Empty backend results)") for r in results)

