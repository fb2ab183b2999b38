"""Parameter and shape validation with PyTorch's own error texts (Convolution.cpp); device-free."""
from __future__ import annotations

from collections.abc import Sequence

from .errors import ConvError
from .params import ConvParams, _sizes
from .rules.context import CpuFacts
from .rules.select import mkldnn_takes
from .tensors import TensorSpec

INT64_MAX = 2**63 - 1

# torch dtype name -> (c10 ScalarType name, caffe2 TypeMeta name as F.convNd's bias check prints it)
_SCALAR = {
    "float32": ("Float", "float"), "float64": ("Double", "double"), "float16": ("Half", "c10::Half"),
    "bfloat16": ("BFloat16", "c10::BFloat16"), "int64": ("Long", "long int"), "int32": ("Int", "int"),
    "int16": ("Short", "short int"), "int8": ("Char", "signed char"), "uint8": ("Byte", "unsigned char"),
    "bool": ("Bool", "bool"), "uint16": ("UInt16", "short unsigned int"), "uint32": ("UInt32", "unsigned int"),
    "uint64": ("UInt64", "long unsigned int"), "complex32": ("ComplexHalf", "c10::complex<c10::Half>"),
    "complex64": ("ComplexFloat", "c10::complex<float>"), "complex128": ("ComplexDouble", "c10::complex<double>"),
}
# torch/csrc/Exceptions.cpp renames these CPU/CUDA types to their legacy Python names (torch.cuda.FloatTensor)
_LEGACY = ("Byte", "Char", "Short", "Int", "Long", "Half", "Float", "Double")
_DISPATCH_KEY = {"cpu": "CPU", "cuda": "CUDA", "mps": "MPS", "xpu": "XPU", "meta": "Meta"}


def _scalar(dtype: str) -> str:
    return _SCALAR[dtype][0] if dtype in _SCALAR else dtype[:1].upper() + dtype[1:]


def _cpp_name(dtype: str) -> str:
    return _SCALAR[dtype][1] if dtype in _SCALAR else f"c10::{_scalar(dtype)}"


def type_string(spec: TensorSpec) -> str:
    """``Tensor::toString()`` as PyTorch's Python layer shows it: 'torch.cuda.FloatTensor', 'CPUBFloat16Type'."""
    if spec.kind != "torch":
        return f"{spec.kind} {spec.dtype} array on {spec.device}"
    scalar = _scalar(spec.dtype)
    if spec.device_type in ("cpu", "cuda") and scalar in _LEGACY:
        return f"torch.{'cuda.' if spec.device_type == 'cuda' else ''}{scalar}Tensor"
    return f"{_DISPATCH_KEY.get(spec.device_type, spec.device_type.upper())}{scalar}Type"


def _type_equal(a: TensorSpec, b: TensorSpec) -> bool:
    """TensorOptions::type_equal: same dispatch key (kind and device type) and dtype; the index is not compared."""
    return (a.kind, a.device_type, a.dtype) == (b.kind, b.device_type, b.dtype)


def _view(shape: Sequence[int], weight_dim: int) -> tuple[int, ...]:
    """ATen's 1-d -> 2-d view (view4d): 1-d convolutions are checked, and reported, as (N, C, 1, L)."""
    return (shape[0], shape[1], 1, *shape[2:]) if weight_dim == 3 else tuple(shape)


def _vparams(p: ConvParams, weight_dim: int) -> ConvParams:
    if weight_dim != 3:
        return p
    return ConvParams((1,) + p.stride, (0,) + p.padding, (1,) + p.dilation, p.transposed, (0,) + p.output_padding,
                      p.groups, (0,) + p.padding_extra)


def padded_shape(shape: Sequence[int], params: ConvParams) -> tuple[int, ...]:
    """The input shape ATen sees: padding='same' pads the input on the high side before aten::convolution."""
    if not any(params.padding_extra) or len(shape) != params.rank + 2:
        return tuple(shape)
    return (shape[0], shape[1], *(i + e for i, e in zip(shape[2:], params.padding_extra)))


def batchify(input: TensorSpec, num_spatial_dims: int, func_name: str) -> bool:
    """ATen's ``batchify``: True if batched, False if unbatched (rank+1 dims), else PyTorch's error."""
    dim_count_no_batch = num_spatial_dims + 1
    dim_count_batch = dim_count_no_batch + 1
    if input.dim == dim_count_batch:
        return True
    if input.dim == dim_count_no_batch:
        return False
    raise ConvError(f"Expected {dim_count_no_batch}D (unbatched) or {dim_count_batch}D (batched) input to "
                    f"{func_name}, but got input of size: {_sizes(input.shape)}")


def check_functional_bias(input: TensorSpec, bias: TensorSpec | None) -> None:
    """conv1d/conv2d/conv3d (integer padding) compare the bias dtype with the input's before anything else."""
    if bias is not None and bias.dtype != input.dtype:
        raise ConvError(f"Input type ({_cpp_name(input.dtype)}) and bias type ({_cpp_name(bias.dtype)}) "
                        "should be the same")


def check_forward(input: TensorSpec, weight: TensorSpec, bias: TensorSpec | None, params: ConvParams) -> None:
    """aten::convolution's checks for a batched input: check_shape_forward, the empty-input rule, and what the
    ATen kernel that would run checks (check_input_same_type_as_parameters, dilation, transposed output size)."""
    shape = padded_shape(input.shape, params)
    check_shape(shape, weight.shape, bias, params)
    if input.kind != "torch":
        _check_types(input, weight, bias, "plain")
    if shape[0] == 0 or shape[1] == 0:
        return  # ATen's Empty backend: nothing else is checked
    if _numel(shape) == 0:
        raise ConvError("Only zero batch or zero channel inputs are supported, but got input shape: "
                        f"{_sizes(_view(shape, weight.dim))}")
    family = _family(input, weight, params)
    op = _slow_op(_vparams(params, weight.dim), input.device_type) if family == "slow" else ""
    if family == "slow":
        _check_devices(input, weight, bias, op)
    else:
        _check_types(input, weight, bias, "mkldnn" if family == "mkldnn" else "plain")
    if 0 in params.dilation:
        if family == "mkldnn" and not params.transposed:
            raise ConvError("non-positive dilation is not supported")
        if family == "cudnn":
            raise ConvError("Dilation must be greater than 0 but got 0")
    _check_kernel_shapes(_view(shape, weight.dim), _view(weight.shape, weight.dim), _vparams(params, weight.dim),
                         input.device_type)
    if family == "slow":
        _check_types(input, weight, bias if _slow_checks_bias_dtype(op, input.device_type) else None, "slow")


# Note [slow kernels' bias dtype]
# Of ATen's slow CPU kernels only slow_conv_transpose3d checks the bias dtype; the others (slow_conv2d, slow_conv3d,
# slow_conv_dilated2d/3d, slow_conv_transpose2d, the 1-d view included) copy the bias into the output, converting
# it, so aten::convolution takes a float64 problem with a float16 bias (torch 2.13, tests/test_bad_input.py). Where
# ATen does, portconv does: its kernels read one dtype, so ProgramRunner converts such a bias to the input's dtype
# (autograd converts its gradient back). The CUDA slow kernels, not measured, keep the check.
def _slow_checks_bias_dtype(op: str, device_type: str) -> bool:
    """Whether the slow kernel ``op`` on ``device_type`` raises for a bias whose dtype is not the input's."""
    return device_type != "cpu" or op == "slow_conv_transpose3d"


def check_shape(input_shape: Sequence[int], weight_shape: Sequence[int], bias: TensorSpec | None,
                params: ConvParams) -> None:
    """ATen's ``check_shape_forward`` (``check_shape_backward`` is the same without a bias), same texts."""
    k, weight_dim, groups = len(input_shape), len(weight_shape), params.groups
    if any(p < 0 for p in params.padding):
        raise ConvError("negative padding is not supported")
    if any(p < 0 for p in params.output_padding):
        raise ConvError("negative output_padding is not supported")
    if any(s <= 0 for s in params.stride):
        raise ConvError("non-positive stride is not supported")
    if any(d < 0 for d in params.dilation):
        raise ConvError("dilation should be greater than zero")
    if groups <= 0:
        raise ConvError(f"expected groups to be greater than 0, but got groups={groups}")
    ws, ins = _sizes(weight_shape), _sizes(input_shape)
    if weight_dim != k:
        raise ConvError(f"Expected {weight_dim}-dimensional input for {weight_dim}-dimensional weight {ws}, but got "
                        f"{k}-dimensional input of size {ins} instead")
    if weight_shape[0] < groups:
        raise ConvError(f"Given groups={groups}, expected weight to be at least {groups} at dimension 0, but got "
                        f"weight of size {ws} instead")
    if weight_shape[0] % groups:
        raise ConvError(f"Given groups={groups}, expected weight to be divisible by {groups} at dimension 0, but got "
                        f"weight of size [{ws}] instead")
    if params.transposed:
        _check_padding_limit(params.padding)
        if input_shape[1] != weight_shape[0]:
            raise ConvError(f"Given transposed=1, weight of size {ws}, expected input{ins} to have {weight_shape[0]} "
                            f"channels, but got {input_shape[1]} channels instead")
        if bias is not None and (bias.dim != 1 or bias.shape[0] != weight_shape[1] * groups):
            raise ConvError(f"Given transposed=1, weight of size {ws}, expected bias to be 1-dimensional with "
                            f"{weight_shape[1] * groups} elements, but got bias of size {_sizes(bias.shape)} instead")
        return
    if input_shape[1] != weight_shape[1] * groups:
        raise ConvError(f"Given groups={groups}, weight of size {ws}, expected input{ins} to have "
                        f"{weight_shape[1] * groups} channels, but got {input_shape[1]} channels instead")
    if bias is not None and (bias.dim != 1 or bias.shape[0] != weight_shape[0]):
        raise ConvError(f"Given weight of size {ws}, expected bias to be 1-dimensional with {weight_shape[0]} "
                        f"elements, but got bias of size {_sizes(bias.shape)} instead")
    _check_padding_limit(params.padding)
    padded = [i + 2 * p for i, p in zip(input_shape[2:], params.padding)]
    kernel = [d * (w - 1) + 1 for d, w in zip(params.dilation, weight_shape[2:])]
    if any(i < w for i, w in zip(padded, kernel)):
        raise ConvError(f"Calculated padded input size per channel: ({' x '.join(map(str, padded))}). Kernel size: "
                        f"({' x '.join(map(str, kernel))}). Kernel size can't be greater than actual input size")


def _check_padding_limit(padding: Sequence[int]) -> None:
    for i, p in enumerate(padding):
        if p > INT64_MAX - p:
            raise ConvError(f"Given padding={p} at dimension {i} , expected padding to be at most {INT64_MAX // 2}")


def _numel(shape: Sequence[int]) -> int:
    n = 1
    for s in shape:
        n *= s
    return n


# Note [Which ATen kernel's text]
# Past check_shape_forward, PyTorch's texts come from the kernel ATen selected, so they differ by device and
# dtype: oneDNN (float32 CPU) says "... should be the same or input should be a MKLDNN tensor ...", the slow
# CPU kernels (float64, int, small float32 problems) say "expected scalar type Double but found Float" after
# their own shape checks, cuDNN uses check_input_same_type_as_parameters' plain text. _family models that
# choice (use_mkldnn for the CPU, as portconv.rules does in full). Where the selected kernel would only fail
# with an internal oneDNN/cuDNN message (zero-size kernels, a transposed output size below 1, a wrong
# grad_output), portconv raises the slow kernels' text instead. pyopencl/cupy arrays use the plain texts.
def use_mkldnn(input_shape: Sequence[int], weight_shape: Sequence[int], dtype: str, params: ConvParams,
               facts: CpuFacts) -> bool:
    """ConvParams::use_mkldnn for a CPU input (rules.mkldnn_takes on the 1-d -> 2-d view)."""
    dim = len(weight_shape)
    return bool(mkldnn_takes(_vparams(params, dim), _view(input_shape, dim), _view(weight_shape, dim), dtype, "cpu",
                             facts))


def _family(input: TensorSpec, weight: TensorSpec, params: ConvParams) -> str:
    """'mkldnn', 'slow', 'cudnn' or 'plain': whose checks PyTorch runs for this non-empty call."""
    if input.kind != "torch" or weight.kind != "torch":
        return "plain"
    if input.device_type == "cpu":
        shape = padded_shape(input.shape, params)
        return "mkldnn" if use_mkldnn(shape, weight.shape, input.dtype, params, CpuFacts.from_torch()) else "slow"
    if input.device_type == "cuda":
        op_big = params.transposed and any(op >= s for op, s in zip(params.output_padding, params.stride))
        return "slow" if op_big or (params.is_depthwise(input.shape, weight.shape) and input.dtype != "float16") \
            else "cudnn"
    return "plain"


def _slow_op(p: ConvParams, device_type: str) -> str:
    """The ATen operator of the slow kernel ATen runs (p on the 1-d -> 2-d view)."""
    rank = p.rank
    if p.transposed:
        return f"slow_conv_transpose{rank}d"
    if any(d != 1 for d in p.dilation) or (rank == 3 and device_type == "cuda"):
        return f"slow_conv_dilated{rank}d"
    return "_slow_conv2d_forward" if rank == 2 else "slow_conv3d_forward"


def _check_devices(input: TensorSpec, weight: TensorSpec, bias: TensorSpec | None, op: str | None = None) -> None:
    """The dispatcher's device check of the operator that runs (``op``: a slow kernel), or a device index check."""
    for name, t in (("weight", weight), ("bias", bias)):
        if t is not None and t.kind == input.kind and t.device != input.device:
            key = "CUDA" if "cuda" in (t.device_type, input.device_type) else input.device_type.upper()
            where = f" (when checking argument in method wrapper_{key}__{op})" if op else ""
            raise ConvError(f"Expected all tensors to be on the same device, but got {name} is on {t.device}, "
                            f"different from other tensors on {input.device}{where}")


def _check_types(input: TensorSpec, weight: TensorSpec, bias: TensorSpec | None, style: str) -> None:
    """check_input_same_type_as_parameters ('plain', 'mkldnn' texts) or the slow kernels' dtype check ('slow')."""
    for name, t in (("weight", weight), ("bias", bias)):
        if t is None:
            continue
        if style == "slow" and t.kind == input.kind:
            if t.dtype != input.dtype:
                raise ConvError(f"expected scalar type {_scalar(input.dtype)} but found {_scalar(t.dtype)}")
        elif not _type_equal(input, t):
            extra = f" or input should be a MKLDNN tensor and {name} is a dense tensor" if style == "mkldnn" else ""
            raise ConvError(f"Input type ({type_string(input)}) and {name} type ({type_string(t)}) should be the "
                            f"same{extra}")
    _check_devices(input, weight, bias)


_KERNEL_HW = "kernel size should be greater than zero, but got kernel_height: {} kernel_width: {}"


def _xs(values) -> str:
    return " x ".join(map(str, values))


def _check_kernel_shapes(i: tuple[int, ...], w: tuple[int, ...], p: ConvParams, device_type: str) -> None:
    """The slow kernels' own shape checks (slow_conv2d/3d, slow_conv_dilated, slow_conv_transpose2d/3d), on the
    1-d -> 2-d view, in their order."""
    ks, ds = w[2:], p.dilation
    if not p.transposed:
        if any(d != 1 for d in ds) or (len(ks) == 3 and device_type == "cuda"):  # SlowDilated2d/3d
            if any(k <= 0 for k in ks):
                raise ConvError(f"kernel size should be greater than zero, but got {_sizes(ks)}")
            if any(d <= 0 for d in ds):
                raise ConvError(f"dilation should be greater than zero, but got {_sizes(ds)}")
        elif any(k <= 0 for k in ks) and len(ks) == 2:  # Slow2d
            raise ConvError(_KERNEL_HW.format(*ks))
        elif any(k <= 0 for k in ks):  # Slow3d
            raise ConvError(f"kernel size should be greater than zero, but got: {_xs(ks)} (TxHxW)")
        return
    names = ("height", "width") if len(ks) == 2 else ("depth", "height", "width")
    if len(ks) == 2 and any(k <= 0 for k in ks):
        raise ConvError(_KERNEL_HW.format(*ks))
    if any(d <= 0 for d in ds):
        raise ConvError("dilation should be greater than zero, but got "
                        + ", ".join(f"dilation_{n}: {d}" for n, d in zip(names, ds)))
    if not all(op < s or op < d for op, s, d in zip(p.output_padding, p.stride, ds)):
        raise ConvError("output padding must be smaller than either stride or dilation, but got "
                        + " ".join(f"{what}_{n}: {v}" for what, vals in
                                   (("output_padding", p.output_padding), ("stride", p.stride), ("dilation", ds))
                                   for n, v in zip(names, vals)))
    if _numel(w) == 0 and len(ks) == 2:
        raise ConvError(f"non-empty 2D or 4D weight tensor expected, but got: {_sizes(w)}")
    if _numel(w) == 0:
        raise ConvError("non-empty 5D (n_output_plane x n_input_plane x kernel_depth x kernel_height x kernel_width) "
                        f"tensor expected for weight, but got: {_sizes(w)}")
    out = [(x - 1) * s - 2 * pad + d * (k - 1) + 1 + op
           for x, s, pad, d, k, op in zip(i[2:], p.stride, p.padding, ds, ks, p.output_padding)]
    if any(o < 1 for o in out):
        raise ConvError(f"Given input size per channel: ({_xs(i[2:])}). Calculated output size per channel: "
                        f"({_xs(out)}). Output size is too small")


def check_backward(grad_output: TensorSpec, problem, bias_sizes, output_mask) -> None:
    """aten::convolution_backward's checks that follow check_shape_backward (which check_forward ran), then the
    grad_output checks of the kernel that would run (Note [Which ATen kernel's text])."""
    input, weight, params = problem.input, problem.weight, problem.params
    if len(output_mask) != 3:
        raise ConvError(f"Tried to convert a List with {len(output_mask)} elements to a fixed-size array of size 3")
    if grad_output.kind != input.kind:
        raise ConvError(f"Input type ({type_string(input)}) and grad_output type ({type_string(grad_output)}) "
                        "should be the same")
    if grad_output.device != input.device:  # the dispatcher checks devices before convolution_backward runs
        key = "CUDA" if "cuda" in (input.device_type, grad_output.device_type) else "CPU"
        raise ConvError(f"Expected all tensors to be on the same device, but got input is on {input.device}, "
                        f"different from other tensors on {grad_output.device} (when checking argument in method "
                        f"wrapper_{key}__convolution_backward)")
    if input.dim != grad_output.dim:
        raise ConvError("Expected input and grad_output to have the same number of dimensions, but got: "
                        f"{input.dim} and {grad_output.dim}")
    if not params.transposed and any(params.output_padding):
        raise ConvError("output_padding is not supported for non-transposed convolutions; got: "
                        + " ".join(map(str, params.output_padding)))
    shape = padded_shape(input.shape, params)
    if shape[0] == 0 or shape[1] == 0:
        return  # ATen's Empty backend only reads input's and weight's shapes
    family = _family(input, weight, params)
    if family == "cudnn" and grad_output.dtype != weight.dtype:
        raise ConvError(f"Expected tensor for argument #1 'grad_output' to have the same type as tensor for argument "
                        f"#2 'weight'; but type {type_string(grad_output)} does not equal {type_string(weight)} "
                        "(while checking arguments for cudnn_convolution_backward_input)")
    _check_grad_output_shape(grad_output.shape, input.shape, weight.shape, params, family, input.device_type)
    if grad_output.dtype != input.dtype and family == "plain":
        raise ConvError(f"Input type ({type_string(input)}) and grad_output type ({type_string(grad_output)}) "
                        "should be the same")
    if grad_output.dtype != input.dtype:
        raise ConvError(f"expected scalar type {_scalar(input.dtype)} but found {_scalar(grad_output.dtype)}")


def _check_grad_output_shape(go: Sequence[int], input_shape, weight_shape, params: ConvParams, family: str,
                             device_type: str) -> None:
    """grad_output against the forward output, with the texts of slow_conv_dilated_shape_check or check_dim_size."""
    wd, g = len(weight_shape), params.groups
    go, out = _view(go, wd), _view(params.output_shape(input_shape, weight_shape), wd)
    i, p = _view(input_shape, wd), _vparams(params, wd)
    if tuple(go) == tuple(out):
        return
    dilated = any(d != 1 for d in p.dilation) or (len(i) == 5 and device_type == "cuda")
    if family == "slow" and not p.transposed and dilated:
        if go[0] != i[0]:
            raise ConvError(f"grad_output.size(0)={go[0]} must be input.size(0)={i[0]}")
        if go[1] // g != out[1] // g:
            raise ConvError(f"grad_output.size(1)={go[1] // g} must be weight.size(0)={out[1] // g}")
        if tuple(go[2:]) != tuple(out[2:]):
            raise ConvError(f"grad_output[2:] shape{_sizes(go[2:])} must be equal to output size "
                            + " ".join(map(str, out[2:])))
    # Slow2d and the transposed kernels run per group; Slow3d takes the groups itself (and checks no batch size)
    per_group = family == "slow" and not (len(i) == 5 and not p.transposed)
    checks = [(1, out[1] // g, go[1] // g)] if per_group else []
    checks += [(1, out[1], go[1])] + [(d, out[d], go[d]) for d in range(2, len(out))] + [(0, out[0], go[0])]
    for d, want, got in checks:
        if want != got:
            raise ConvError(f"Expected a tensor of dimension {len(out)} and tensor.size[{d}] == {want} but got: "
                            f"dimension {len(out)} and tensor.size[{d}] = {got}")


def is_empty_problem(problem) -> bool:
    """ATen's Empty backend: a batch of zero or zero input channels (other empty inputs fail in check_forward)."""
    shape = problem.input.shape
    return shape[0] == 0 or shape[1] == 0


def _vendor_array(x, shape, dtype, zero: bool):
    """An array like ``x`` (pyopencl or cupy) of ``shape``; zero-filled when ``zero``."""
    kind = (type(x).__module__ or "").split(".")[0]
    if kind == "pyopencl":
        import pyopencl.array as cla

        return (cla.zeros if zero else cla.empty)(x.queue, tuple(shape), dtype)
    if kind == "cupy":
        import cupy

        with x.device:
            return (cupy.zeros if zero else cupy.empty)(tuple(shape), dtype)
    raise TypeError(f"portconv takes torch tensors, pyopencl arrays or cupy arrays, not {type(x).__name__}")


def empty_forward(input, weight, bias, params: ConvParams):
    """What ATen's Empty backend returns for N == 0 or C == 0: the same ops on torch tensors (dtype promotion,
    autograd and errors included), an empty array of the output shape for pyopencl/cupy arrays."""
    out_shape = params.output_shape(tuple(input.shape), tuple(weight.shape))
    if not (type(input).__module__ or "").startswith("torch"):
        return _vendor_array(input, out_shape, input.dtype, zero=False)
    weight_view = weight.reshape(-1)
    output = input.view(-1) * weight_view if input.shape[1] == 0 else input * weight_view.select(0, 0)
    if bias is not None:
        output.add_(bias.select(0, 0))
    return output.view(out_shape)


def empty_backward(grad_output, input, weight, params: ConvParams, mask, bias_sizes=None):
    """ATen's Empty backward: zeros like input and weight, zeros of bias_sizes in weight's dtype (the bias'
    forward shape when bias_sizes is None, where ATen itself would abort). None where the mask is False."""
    if bias_sizes is None:
        bias_sizes = [weight.shape[1] * params.groups if params.transposed else weight.shape[0]]
    if not (type(input).__module__ or "").startswith("torch"):
        return (_vendor_array(input, input.shape, input.dtype, True) if mask[0] else None,
                _vendor_array(weight, weight.shape, weight.dtype, True) if mask[1] else None,
                _vendor_array(weight, bias_sizes, weight.dtype, True) if mask[2] else None)
    import torch

    return (torch.zeros_like(input) if mask[0] else None, torch.zeros_like(weight) if mask[1] else None,
            torch.zeros(list(bias_sizes), dtype=weight.dtype, device=weight.device) if mask[2] else None)
