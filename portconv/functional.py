"""The public API: torch.nn.functional-style convolutions, aten::convolution(_backward) and plan()."""
from __future__ import annotations

from collections.abc import Sequence

from . import composite, fastpath, policy, validate
from .params import ConvParams
from .planner import Plan, automatic, backward_problem, make_problem, params_of, prepare, select
from .tensors import spec_of


def plan(input, weight, bias=None, stride=1, padding=0, dilation=1, transposed=False, output_padding=0, groups=1,
         backend=None) -> Plan:
    """The plan portconv would use for this convolution (batched or unbatched input), without running it."""
    params = params_of(weight, stride, padding, dilation, transposed, output_padding, groups)
    ispec = spec_of(input)
    if ispec.dim == params.rank + 1:
        input = input[None]
    return select(make_problem(input, weight, bias, params), backend)


def _function():
    """autograd.lean_apply (imported on first use: it imports torch)."""
    global _apply
    if _apply is None:
        from .autograd import lean_apply

        _apply = lean_apply
    return _apply


_apply = None


# A call's mode: 0 a public call (Note [eager and traced calls] is checked first), 1 that check done, 2 that check
# done and the call always recorded by ConvFunction (functorch transforms, forward AD).
def _execute(p: Plan | None, input, weight, bias, params: ConvParams, mode: int = 0):
    """Run a planned call (None: ATen's Empty problem), through autograd when a gradient is wanted."""
    if p is None:
        return validate.empty_forward(input, weight, bias, params)
    if mode == 2:
        from .autograd import ConvFunction

        return ConvFunction.apply(input, weight, bias, p)
    n = p.runner.native
    if n is not None:  # Note [native executor]: its node, where a gradient is wanted
        return n.conv(input, weight, bias)
    if p.aten_autograd or not fastpath.wants_grad(input, weight, bias):  # Note [ATen-recorded plans]
        return p.runner.forward(input, weight, bias)
    return (_apply or _function())(input, weight, bias, p)


def convolution(input, weight, bias=None, stride: Sequence[int] = (1,), padding: Sequence[int] = (0,),
                dilation: Sequence[int] = (1,), transposed: bool = False, output_padding: Sequence[int] = (0,),
                groups: int = 1, backend=None):
    """``aten::convolution`` semantics (batched input, explicit parameters), on the chosen backend."""
    return _convolution(input, weight, bias, stride, padding, dilation, transposed, output_padding, groups, backend)


def _convolution(input, weight, bias, stride, padding, dilation, transposed, output_padding, groups, backend,
                 mode: int = 0):
    if mode == 0 and fastpath.special():  # Note [eager and traced calls]
        input, weight, bias = composite.autocast(input, weight, bias)
        if composite.traced(input):
            return composite.traced_convolution(input, weight, bias, stride, padding, dilation, transposed,
                                                output_padding, groups, backend)
        mode = composite.mode(input)
    key = fastpath.key("convolution", input, weight, bias, (stride, padding, dilation, transposed, output_padding,
                                                           groups), backend)
    hit = fastpath.get(key)
    if hit is not None:  # Note [fast path]
        return _execute(hit[0], input, weight, bias, hit[1], mode)
    if fastpath.foreign(input, weight, bias):
        return composite.traced_forward(input, weight, bias, params_of(weight, stride, padding, dilation, transposed,
                                                                       output_padding, groups), backend)
    params = params_of(weight, stride, padding, dilation, transposed, output_padding, groups)
    if spec_of(input).dtype in composite.COMPLEX:  # Note [complex convolution]
        return composite.complex_conv(lambda x, w, b: _convolution(x, w, b, stride, padding, dilation, transposed,
                                                                   output_padding, groups, backend, mode or 1),
                                      input, weight, bias)
    p = prepare(input, weight, bias, params, backend, None if key is None else key[-1])
    fastpath.put(key, (p, params))
    return _execute(p, input, weight, bias, params, mode)


def convolution_backward(grad_output, input, weight, bias_sizes, stride, padding, dilation, transposed,
                         output_padding, groups, output_mask=(True, True, True), backend=None):
    """``aten::convolution_backward``: returns (grad_input, grad_weight, grad_bias), None where the mask is False.

    This is the call for a user who has a forward kernel of their own and needs a correct backward. Its results are
    differentiable (aten's double backward, Note [portconv autograd]) when an operand requires grad.
    """
    mode = 0
    if fastpath.special():  # Note [eager and traced calls]
        if composite.traced(input):
            return composite.traced_backward(grad_output, input, weight, bias_sizes, stride, padding, dilation,
                                             transposed, output_padding, groups, output_mask, backend)
        mode = composite.mode(input)
    # Note [fast path]: grad_output rides in the key's bias slot (its type, shape, strides, dtype and device)
    key = fastpath.key("convolution_backward", input, weight, grad_output,
                       (stride, padding, dilation, transposed, output_padding, groups,
                        () if bias_sizes is None else bias_sizes, tuple(1 if m else 0 for m in output_mask)), backend)
    hit = fastpath.get(key)
    if hit is not None:
        return _backward(hit[0], hit[1], grad_output, input, weight, mode)
    if fastpath.foreign(grad_output, input, weight):
        return composite.traced_backward(grad_output, input, weight, bias_sizes, stride, padding, dilation,
                                         transposed, output_padding, groups, output_mask, backend)
    params = params_of(weight, stride, padding, dilation, transposed, output_padding, groups, backward=True)
    bias_sizes = None if bias_sizes is None else [int(s) for s in bias_sizes]
    problem = backward_problem(grad_output, input, weight, params, bias_sizes, output_mask)
    mask = tuple(bool(m) for m in output_mask)
    if validate.is_empty_problem(problem):
        return validate.empty_backward(grad_output, input, weight, params, mask, bias_sizes)
    p = select(problem, backend)
    fastpath.put(key, (p, mask))
    return _backward(p, mask, grad_output, input, weight, mode)


def _backward(p: Plan, mask: tuple, grad_output, input, weight, mode: int):
    if mode == 2 or fastpath.wants_grad(grad_output, input, weight):
        from .autograd import backward_apply

        return backward_apply(grad_output, input, weight, p, mask)
    return p.backward(grad_output, input, weight, mask)


# Note [module memo]
# A converted module keeps its last call's fast-path entry (Note [fast path]) with the key it was found under and the
# argument objects it was called with. A call that is not special (no tracer, autocast, transform or forward-AD level)
# whose tensors match that key field by field (fastpath.matches: type, shape, strides, dtype, device of the input,
# weight and bias),
# with the same argument objects, backend, call state and fast-path generation, runs that entry directly: the same
# plan the key would find, without building, hashing and looking up the key (a converted MobileNetV2's convolutions
# spent about half of portconv's host time there on an H100 host). Under autocast and nothing else special, a module
# keeps the key of its uncast operands with the autocast dtype: where its call was found planned as ATen's (Note
# [autocast and ATen's plans]) a matching call with the same autocast dtype is PyTorch's own F.convNd; otherwise the
# memo holds the entry of the cast operands (the cast is a function of the uncast specs and the dtype, so the plan is
# too), and a matching call casts and runs it. Anything else takes _convnd, which renews the memo. Copies and pickles
# of the module carry no memo.
class _Memo:
    __slots__ = ("key", "args", "entry", "generation", "aten", "cast")

    def __init__(self, key, args, entry, cast=None):
        self.key, self.args, self.entry, self.generation, self.cast = key, args, entry, fastpath.generation, cast
        p, _, batched = entry or (None, None, False)  # a runner's direct call (torch.convolution, its arguments)
        self.aten = getattr(p.runner, "direct", None) if p is not None and batched else None

    def __reduce__(self):
        return _no_memo, ()

    def __deepcopy__(self, memo):
        return None


def _no_memo():
    return None


def module_convnd(module, rank: int, name: str, input, weight, bias, stride, padding, dilation, groups, backend,
                  transposed=False, output_padding=0):
    """A converted module's call: the module's memo where it holds (Note [module memo]), else _convnd (which also
    takes Note [ATen's modules]: those calls keep no memo)."""
    m = module.__dict__.get("_pc_memo")
    if m is not None and m.generation == fastpath.generation and type(input) is m.key[1] and (
            not fastpath.special() if m.cast is None
            else not fastpath.traced_or_transformed() and composite.autocast_dtype(input) == m.cast):
        a = m.args
        if (a[0] is stride and a[1] is padding and a[2] is dilation and a[3] is groups and a[4] is output_padding
                and backend is m.key[13] and fastpath.matches(m.key, input, weight, bias)):
            if m.cast is not None:
                if m.entry is None:  # Note [autocast and ATen's plans]: PyTorch's call on the uncast operands
                    return composite.torch_convnd(name, input, weight, bias, stride, padding, dilation, groups,
                                                  output_padding)
                return _run(m.entry, *composite.cast(m.cast, input, weight, bias), 1)  # the entry's operands
            if m.aten is not None:
                return m.aten[0](input, weight, bias, *m.aten[1])
            return _run(m.entry, input, weight, bias)
    return _convnd(rank, name, input, weight, bias, stride, padding, dilation, groups, backend, transposed,
                   output_padding, memo_owner=module)


def _run(entry: tuple, input, weight, bias, mode: int = 0):
    """A fast-path entry (plan, params, batched) run on a call's operands; an unbatched input gets its batch axis."""
    p, params, batched = entry
    if batched:
        return _execute(p, input, weight, bias, params, mode)
    return _execute(p, input[None], weight, bias, params, mode)[0]


def _remember(owner, key, args: tuple, entry: tuple | None, cast=None) -> None:
    if key is not None and isinstance(key[1], type):  # a torch-tensor key (arrays have keys of their own shape)
        owner.__dict__["_pc_memo"] = _Memo(key, args, entry, cast)


def _remember_call(owner, key, akey, mode: int, args: tuple, entry: tuple) -> None:
    """Note [module memo] after _convnd found ``entry``: a plain call keeps it under its key; an autocast call (akey:
    the uncast operands' key, with the autocast dtype) keeps it under that key, or only the finding where the plan is
    ATen's (Note [autocast and ATen's plans])."""
    if mode == 0:
        _remember(owner, key, args, entry)
    elif akey is not None and mode == 1:
        aten = entry[0] is not None and entry[0].torch_own
        _remember(owner, akey, args, None if aten else entry, akey[0][1])


def aten_module(transposed: bool, groups: int, backend, input) -> bool:
    """Note [ATen's modules]: a public eager call whose automatic plan is ATen's for every problem, with no tracer,
    transform or other plan in force: PyTorch's own call is the whole answer (converted modules ask it first)."""
    return backend is None and policy.never_own(transposed, groups) and fastpath.plain_eager(input) and automatic()


def _convnd(rank: int, name: str, input, weight, bias, stride, padding, dilation, groups, backend,
            transposed=False, output_padding=0, mode: int = 0, memo_owner=None):
    if mode == 0 and aten_module(transposed, groups, backend, input):  # Note [ATen's modules]
        return composite.torch_convnd(name, input, weight, bias, stride, padding, dilation, groups, output_padding)
    akey, args = None, (stride, padding, dilation, groups, output_padding)
    if mode == 0 and fastpath.special():  # Note [eager and traced calls]
        cast, traced = composite.autocast_dtype(input), composite.traced(input)
        mode = 0 if traced else composite.mode(input)
        if cast is not None and mode == 1:
            # Note [autocast and ATen's plans]: keyed by the operands as they come, before the cast
            akey = fastpath.key((name, cast), input, weight, bias, args, backend)
            if fastpath.get(akey) is not None:
                if memo_owner is not None:
                    _remember(memo_owner, akey, args, None, cast)
                return composite.torch_convnd(name, input, weight, bias, stride, padding, dilation, groups,
                                              output_padding)
        input, weight, bias = composite.cast(cast, input, weight, bias)  # before F.convNd's checks, as ATen's does
        if traced:
            return composite.traced_convnd(rank, name, input, weight, bias, stride, padding, dilation, groups, backend,
                                           transposed, output_padding)
    key = fastpath.key(name, input, weight, bias, args, backend)
    hit = fastpath.get(key)
    if hit is not None:  # Note [fast path]
        if akey is not None and hit[0] is not None and hit[0].torch_own:
            fastpath.put(akey, (True,))
        if memo_owner is not None:
            _remember_call(memo_owner, key, akey, mode, args, hit)
        return _run(hit, input, weight, bias, mode)
    if fastpath.foreign(input, weight, bias):
        return composite.traced_convnd(rank, name, input, weight, bias, stride, padding, dilation, groups, backend,
                                       transposed, output_padding)
    if not transposed and not isinstance(padding, str):  # conv1d/2d/3d check the bias dtype first
        validate.check_functional_bias(spec_of(input), None if bias is None else spec_of(bias))
    is_batched = validate.batchify(spec_of(input), rank, name)
    if spec_of(input).dtype in composite.COMPLEX:  # Note [complex convolution]
        return composite.complex_conv(lambda x, w, b: _convnd(rank, name, x, w, b, stride, padding, dilation, groups,
                                                              backend, transposed, output_padding, mode or 1),
                                      input, weight, bias)
    if not is_batched:
        input = input[None]
    params = ConvParams.make(rank, stride, padding, dilation, transposed, output_padding, groups,
                             weight_shape=spec_of(weight).shape, input_shape=spec_of(input).shape)
    p = prepare(input, weight, bias, params, backend, None if key is None else key[-1])
    fastpath.put(key, (p, params, is_batched))
    if memo_owner is not None:
        _remember_call(memo_owner, key, akey, mode, args, (p, params, is_batched))
    if akey is not None and p is not None and p.torch_own:
        fastpath.put(akey, (True,))
    out = _execute(p, input, weight, bias, params, mode)
    return out if is_batched else out[0]


def conv1d(input, weight, bias=None, stride=1, padding=0, dilation=1, groups=1, backend=None):
    return _convnd(1, "conv1d", input, weight, bias, stride, padding, dilation, groups, backend)


def conv2d(input, weight, bias=None, stride=1, padding=0, dilation=1, groups=1, backend=None):
    return _convnd(2, "conv2d", input, weight, bias, stride, padding, dilation, groups, backend)


def conv3d(input, weight, bias=None, stride=1, padding=0, dilation=1, groups=1, backend=None):
    return _convnd(3, "conv3d", input, weight, bias, stride, padding, dilation, groups, backend)


def conv_transpose1d(input, weight, bias=None, stride=1, padding=0, output_padding=0, groups=1, dilation=1,
                     backend=None):
    return _convnd(1, "conv_transpose1d", input, weight, bias, stride, padding, dilation, groups, backend,
                   True, output_padding)


def conv_transpose2d(input, weight, bias=None, stride=1, padding=0, output_padding=0, groups=1, dilation=1,
                     backend=None):
    return _convnd(2, "conv_transpose2d", input, weight, bias, stride, padding, dilation, groups, backend,
                   True, output_padding)


def conv_transpose3d(input, weight, bias=None, stride=1, padding=0, output_padding=0, groups=1, dilation=1,
                     backend=None):
    return _convnd(3, "conv_transpose3d", input, weight, bias, stride, padding, dilation, groups, backend,
                   True, output_padding)


def _register_ops() -> None:
    from . import ops  # noqa: F401 - registers portconv::convolution(_backward) (Note [custom ops])


fastpath.on_torch(_register_ops)  # the custom ops registered as soon as torch is, before any tracer meets a call
fastpath._init_torch()  # with torch already imported: bound (and the ops registered) now
