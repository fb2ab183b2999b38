"""What PyTorch composes around aten::convolution, offered to functional.py: the traced route, autocast, complex."""
from __future__ import annotations

from . import fastpath, validate
from .params import ConvParams
from .tensors import spec_of

COMPLEX = ("complex64", "complex128")

# Note [eager and traced calls]
# A public call takes the lean eager path (fastpath, ConvFunction) unless fastpath.special() holds: torch.compile
# or export is tracing, a torch dispatch mode is active, autocast is on, or a functorch transform or forward-AD
# level is active. Then functional.py decides with this module's functions, for convNd and convolution alike
# (convolution_backward the same, less autocast, which has no rule for aten::convolution_backward):
#   traced (compiling or a dispatch mode, which is how export and make_fx trace): the custom ops of ops.py
#     (Note [custom ops]); the tracer sees only the argument normalisation below and one op per convolution;
#   autocast: the operands cast as ATen's autocast wrapper casts them (autocast()), then the eager path;
#   a functorch transform or forward AD: the eager path, always through ConvFunction (its jvp and vmap rules).
# The slow path of an eager call sends to the ops what the runners cannot read (fastpath.foreign): tensor subclasses
# that dispatch in Python (FakeTensor, FunctionalTensor, ...) and legacy-vmap tensors
# (autograd.grad(..., is_grads_batched=True)).


def traced(input) -> bool:
    """A tracer records this call on torch tensors (pyopencl and cupy arrays are never traced)."""
    torch = fastpath._torch
    return isinstance(input, torch.Tensor) and (torch.compiler.is_compiling()
                                                or torch._C._len_torch_dispatch_stack() > 0)


def mode(input) -> int:
    """functional's call mode after this check: 2 (always through ConvFunction) for torch tensors while a functorch
    transform or a forward-AD level is active, else 1."""
    torch = fastpath._torch
    recording = torch._C._are_functorch_transforms_active() or torch.autograd.forward_ad._current_level >= 0
    return 2 if recording and isinstance(input, torch.Tensor) else 1


def _ops():
    from . import ops

    return ops


# Note [autocast and ATen's plans]
# Under autocast a convNd call whose plan (for the cast operands) is ATen's (Plan.torch_own: the aten backend),
# is PyTorch's own call: torch.nn.functional.convNd on the operands as they came, cast by ATen's autocast wrapper
# (in C++, with its cache of weight casts) into the very convolution the plan names. functional.py keeps, per call
# key of the uncast operands and the autocast dtype, only that the plan is ATen's (the cast is a function of the
# operands' specs and the dtype, so the plan is too); any other plan takes the cast and the eager path each call.
def autocast_dtype(input):
    """The dtype autocast casts ``input``'s convolutions to, or None when autocast is off for its device type."""
    torch = fastpath._torch
    if not isinstance(input, torch.Tensor):
        return None
    device_type = input.device.type
    return torch.get_autocast_dtype(device_type) if torch.is_autocast_enabled(device_type) else None


def torch_convnd(name: str, input, weight, bias, stride, padding, dilation, groups, output_padding):
    """torch.nn.functional's ``name`` (conv1d .. conv_transpose3d) with these arguments (Note [autocast and ATen's
    plans])."""
    fn = getattr(fastpath._torch.nn.functional, name)
    if name.startswith("conv_transpose"):
        return fn(input, weight, bias, stride, padding, output_padding, groups, dilation)
    return fn(input, weight, bias, stride, padding, dilation, groups)


def autocast(input, weight, bias):
    """The operands as ATen's autocast wrapper for a lower-precision op passes them on (Note [eager and traced
    calls]); unchanged when autocast is off for the input's device type."""
    return cast(autocast_dtype(input), input, weight, bias)


def cast(dtype, input, weight, bias):
    """The operands cast to ``dtype`` (autocast_dtype()'s answer) as ATen's autocast wrapper casts them; unchanged
    for None."""
    if dtype is None:
        return input, weight, bias
    return _ops().autocast_args((input, weight, bias), input.device.type, dtype)


def traced_convolution(input, weight, bias, stride, padding, dilation, transposed, output_padding, groups, backend):
    """convolution() as the tracer records it: portconv::convolution."""
    params = ConvParams.make(max(weight.dim() - 2, 1), stride, padding, dilation, transposed, output_padding, groups,
                             weight_shape=tuple(weight.shape))
    return traced_forward(input, weight, bias, params, backend)


def traced_convnd(rank, name, input, weight, bias, stride, padding, dilation, groups, backend, transposed,
                  output_padding):
    """conv1d..conv_transpose3d as the tracer records them: F.convNd's own checks, then portconv::convolution."""
    if not transposed and not isinstance(padding, str) and bias is not None and bias.dtype != input.dtype:
        validate.check_functional_bias(spec_of(input), spec_of(bias))
    if input.dim() not in (rank + 1, rank + 2):
        validate.batchify(spec_of(input), rank, name)
    batched = input.dim() == rank + 2
    x = input if batched else input.unsqueeze(0)
    params = ConvParams.make(rank, stride, padding, dilation, transposed, output_padding, groups,
                             weight_shape=tuple(weight.shape), input_shape=tuple(x.shape))
    out = traced_forward(x, weight, bias, params, backend)
    return out if batched else out.squeeze(0)


def traced_forward(input, weight, bias, params: ConvParams, backend):
    ops = _ops()
    if input.is_complex():
        return complex_conv(lambda x, w, b: ops.forward(x, w, b, params, backend), input, weight, bias)
    return ops.forward(input, weight, bias, params, backend)


def traced_backward(grad_output, input, weight, bias_sizes, stride, padding, dilation, transposed, output_padding,
                    groups, output_mask, backend):
    """convolution_backward as the tracer records it: portconv::convolution_backward."""
    params = ConvParams.make(max(weight.dim() - 2, 1), stride, padding, dilation, transposed, output_padding, groups,
                             weight_shape=tuple(weight.shape), backward=True)
    mask = tuple(bool(m) for m in output_mask)
    return _ops().backward(grad_output, input, weight, params, mask, backend,
                           None if bias_sizes is None else list(bias_sizes))


def check_complex(input, weight, bias) -> None:
    """complex_convolution's check_input_same_type_as_parameters, PyTorch's text."""
    if weight.dtype != input.dtype or (bias is not None and bias.dtype != input.dtype):
        validate._check_types(spec_of(input), spec_of(weight), None if bias is None else spec_of(bias), "plain")


def _parts(t):
    r = fastpath._torch.view_as_real(t.resolve_conj())
    return r.select(-1, 0), r.select(-1, 1)


# Note [complex convolution]
# ATen's complex_convolution (Convolution.cpp), in its order and with its operations, so values match F.conv*:
# with Gauss's trick, a = conv(xr, wr, br), b = conv(xi, wi), c = conv(xr + xi, wr + wi, br + bi), and
# conv(x, w, b) = a - b + i (c - a - b). ``conv`` is a real portconv convolution (eager or traced), so the
# gradients, forward AD and vmap of the complex call are those of three real ones, as in PyTorch.
def complex_conv(conv, input, weight, bias):
    check_complex(input, weight, bias)
    xr, xi = _parts(input)
    wr, wi = _parts(weight)
    if bias is None:
        a, b, c = conv(xr, wr, None), conv(xi, wi, None), conv(xr + xi, wr + wi, None)
    else:
        br, bi = _parts(bias)
        a, b, c = conv(xr, wr, br), conv(xi, wi, None), conv(xr + xi, wr + wi, br + bi)
    return a - b + 1j * (c - a - b)
