"""Case inputs (seeded random data in the case's layout) and the float64 PyTorch CPU reference with its |.| bound."""
from __future__ import annotations

import contextlib
import dataclasses
import warnings

import torch

from .cases import Case

DTYPES = {"float32": torch.float32, "float64": torch.float64, "float16": torch.float16, "bfloat16": torch.bfloat16}
TENSORS = ("forward", "grad_input", "grad_weight", "grad_bias")


def torch_dtype(name: str) -> torch.dtype:
    try:
        return DTYPES[name]
    except KeyError:
        raise ValueError(f"unknown dtype {name!r}; choose from {', '.join(DTYPES)}") from None


@dataclasses.dataclass
class Inputs:
    """The tensors one case runs on, in the case's dtype, layout and device."""

    input: torch.Tensor
    weight: torch.Tensor
    bias: torch.Tensor | None
    grad_output: torch.Tensor

    def tensors(self) -> dict[str, torch.Tensor]:
        d = {"input": self.input, "weight": self.weight, "grad_output": self.grad_output}
        if self.bias is not None:
            d["bias"] = self.bias
        return d


def _random(gen: torch.Generator, shape) -> torch.Tensor:
    """Uniform in [-1, 1) in float64 (rounded to the case dtype later); never zeros."""
    return torch.rand(shape, generator=gen, dtype=torch.float64, device="cpu") * 2 - 1  # whatever the default device


def _buffer(gen: torch.Generator | None, shape, dtype, device) -> torch.Tensor:
    if gen is None:
        return torch.empty(shape, dtype=dtype, device=device)
    return _random(gen, shape).to(dtype).to(device)


def _in_layout(x: torch.Tensor, layout: str, gen: torch.Generator | None, device) -> torch.Tensor:
    """``x`` (CPU, dense, in its dtype) on ``device``: contiguous, channels-last, a strided view with an offset, or
    (the fuzzer's 'expanded') its first leading slice expanded with stride 0.

    The unused elements around a strided view hold random values too (seeded), never zeros; with ``gen`` None
    (tensors for planning only) nothing is filled.
    """
    if layout == "chlast" and x.dim() >= 3:
        # (N, *spatial, C) storage seen as (N, C, *spatial): channels-last for every rank, 1-D included
        perm = (0, *range(2, x.dim()), 1)
        inv = [perm.index(i) for i in range(x.dim())]
        return x.permute(perm).contiguous().to(device).permute(inv)
    if layout == "strided":
        if x.dim() == 1:  # bias: every other element of a longer buffer
            buf = _buffer(gen, (2 * x.numel() + 1,), x.dtype, device)
            view = buf[1::2]
        else:  # batch and channels swapped in storage, last spatial dim strided by 2, a storage offset of 1
            shape = list(x.shape)
            buf = _buffer(gen, [shape[1], shape[0], *shape[2:-1], 2 * shape[-1] + 1], x.dtype, device)
            view = buf.transpose(0, 1)[..., 1::2]
        if gen is not None:
            view.copy_(x)
        return view
    if layout == "expanded" and x.dim() >= 3:  # the first batch row (weight: first output channel), stride 0
        return x[:1].contiguous().to(device).expand(x.shape)
    if layout in ("contig", "chlast", "expanded"):
        return x.contiguous().to(device)
    raise ValueError(f"unknown layout {layout!r}")


def make_inputs(case: Case, dtype: str, device: str | torch.device = "cpu", out_shape=None,
                fill: bool = True) -> Inputs:
    """Fresh random data seeded by the case (the same values for every dtype before rounding), in its layout.

    ``out_shape`` is grad_output's shape (PyTorch's forward output shape); by default ConvParams computes it.
    ``fill=False`` allocates the same layouts without data (for planning large problems).
    """
    gen = torch.Generator().manual_seed(case.seed) if fill else None
    dt = torch_dtype(dtype)

    def data(shape):
        return _random(gen, shape).to(dt) if fill else torch.empty(shape, dtype=dt, device="cpu")

    x = data(case.input_shape)
    w = data(case.weight_shape)
    b = data((case.k,))
    g = data(out_shape if out_shape is not None else case.output_shape)
    return Inputs(input=_in_layout(x, case.layout, gen, device), weight=_in_layout(w, case.layout, gen, device),
                  bias=_in_layout(b, case.layout, gen, device) if case.bias else None,
                  grad_output=_in_layout(g, case.layout, gen, device))


def output_shape(case: Case) -> tuple[int, ...]:
    """PyTorch's own output shape for the case (evaluated on meta tensors, so empty-input quirks match)."""
    x = torch.empty(case.input_shape, dtype=torch.float64, device="meta")
    w = torch.empty(case.weight_shape, dtype=torch.float64, device="meta")
    return tuple(_forward(case, x, w, None).shape)


def _forward(case: Case, x, w, b):
    a = case.conv_args()
    if isinstance(a["padding"], str):  # torch's own 'same'/'valid' path, independent of portconv's ConvParams
        fn = {1: torch.nn.functional.conv1d, 2: torch.nn.functional.conv2d, 3: torch.nn.functional.conv3d}[case.rank]
        with warnings.catch_warnings():  # "padding='same' with even kernel lengths ... zero-padded copy": expected
            warnings.filterwarnings("ignore", message=".*padding='same'.*", category=UserWarning)
            return fn(x, w, b, a["stride"], a["padding"], a["dilation"], a["groups"])
    return torch.ops.aten.convolution(x, w, b, **a)


def _backward(case: Case, g, x, w, mask):
    a = case.conv_args()
    if isinstance(a["padding"], str):
        leaves = [t.detach().requires_grad_(m) for t, m in zip((x, w), mask[:2])]
        b = torch.zeros(case.k, dtype=x.dtype, requires_grad=mask[2])
        with torch.enable_grad():
            y = _forward(case, leaves[0], leaves[1], b)
            wanted = [t for t, m in zip((*leaves, b), mask) if m]
            grads = iter(torch.autograd.grad(y, wanted, g, allow_unused=True))
        out = [next(grads) if m else None for m in mask]
        return tuple(torch.zeros_like(t) if m and o is None else o for t, m, o in zip((x, w, b), mask, out))
    return torch.ops.aten.convolution_backward(g, x, w, [case.k], **a, output_mask=list(mask))


@dataclasses.dataclass
class Reference:
    """float64 results and the matching sum-of-|terms| bound, per tensor (None where the mask is False);
    ``partial`` holds the forward result before the bias is added (only with a bias)."""

    value: dict[str, torch.Tensor | None]
    absolute: dict[str, torch.Tensor | None]
    partial: dict[str, torch.Tensor | None] = dataclasses.field(default_factory=dict)


@contextlib.contextmanager
def _one_thread_if_small(case: Case):
    """Tiny CPU convolutions run far faster on one thread (no OpenMP wake-ups, which cost milliseconds on a
    busy two-core machine); large ones (`portconv conv --verify` on real layers) keep every thread."""
    work = _numel(case.output_shape) * (case.c // max(case.groups, 1)) * _numel(case.kernel)
    old = torch.get_num_threads()
    if work > 1 << 22 or old == 1:
        yield
        return
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(old)


def _numel(shape) -> int:
    n = 1
    for s in shape:
        n *= s
    return n


def reference(case: Case, inputs: Inputs) -> Reference:
    """PyTorch CPU in float64 on the case's (already dtype-rounded) inputs, and on their absolute values."""
    x, w, g = (t.detach().to("cpu", torch.float64).contiguous() for t in (inputs.input, inputs.weight,
                                                                           inputs.grad_output))
    b = None if inputs.bias is None else inputs.bias.detach().to("cpu", torch.float64).contiguous()
    with torch.no_grad(), _one_thread_if_small(case):
        val = {"forward": _forward(case, x, w, b)}
        val.update(zip(TENSORS[1:], _backward(case, g, x, w, case.mask)))
        ab = {"forward": _forward(case, x.abs(), w.abs(), None if b is None else b.abs())}
        ab.update(zip(TENSORS[1:], _backward(case, g.abs(), x.abs(), w.abs(), case.mask)))
        part = {"forward": _forward(case, x, w, None) if b is not None else None}
    return Reference(val, ab, part)
