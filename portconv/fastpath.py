"""Per call: the cache that skips validation and planning (Note [fast path]), the special-mode and tensor tests."""
from __future__ import annotations

import collections
import sys
import types
from collections.abc import Callable

from . import knobs
from .backends import BackendId
from .planner import _clear_hooks, call_state
from .tensors import ARRAY_DEVICE_TYPES, array_key

# Note [fast path]
# A repeated call skips spec building, validation and planning: the cache maps everything those read to their outcome
# (the plan, or None for ATen's Empty problems). The key holds, per tensor, its exact type, shape, strides, dtype and
# device; the arguments, accepted only as ints, strings or tuples/lists of ints (a float, bool or odd sequence
# takes the slow path, so equal-but-different values never share an entry); the backend request; and
# plan.call_state() (Note [plan cache]). Only calls that passed validation are stored, so bad input always reaches
# the checks and raises PyTorch's error before any kernel runs. What is not in the key is checked on every call:
# grad mode and requires_grad. pyopencl and cupy arrays take the same path (tensors.array_key: per array exactly
# what spec_of reads of it); they carry no autograd. The cache is LRU-bounded like the plan cache (PORTCONV_PLAN_CACHE).
_entries: collections.OrderedDict[tuple, tuple] = collections.OrderedDict()
_torch = None  # the torch module once it is imported (portconv never imports it for pyopencl/cupy arrays)
_tensor_types: tuple = ()
_strided = None
generation = 0  # bumped whenever the entries are cleared: module memos (Note [module memo]) older than it are stale


def _clear() -> None:
    global generation
    _entries.clear()
    generation += 1


_clear_hooks.append(_clear)
_on_torch: list[Callable[[], None]] = []  # run once torch is bound: functional's registers the custom ops (ops.py)
# The custom ops' ConvParams entry points (ops.forward, ops.backward), registered by ops.py when it is imported (it is
# as soon as torch is bound: functional's _on_torch hook): where autograd.py, below ops.py, sends the calls the
# runners cannot read (foreign(), Note [portconv autograd]).
traced = types.SimpleNamespace(forward=None, backward=None)


def _arg(v):
    t = type(v)
    if t is int or t is str:
        return v
    if t is bool:
        return bool, v  # True == 1: kept apart from the ints
    if (t is tuple or t is list) and all(type(e) is int for e in v):
        return tuple(v)
    raise TypeError  # not cacheable: the slow path decides


def _key_args(args: tuple) -> tuple:
    """The call's arguments as part of a key: as they are when each is an int or a tuple of ints (torch.nn's
    modules pass tuples), else through _arg (TypeError: not cacheable)."""
    for v in args:
        t = type(v)
        if t is int:
            continue
        if t is tuple:
            for e in v:
                if type(e) is not int:
                    return tuple(_arg(v) for v in args)
            continue
        return tuple(_arg(v) for v in args)
    return args


def _keyable_backend(backend) -> bool:
    return backend is None or type(backend) is str or type(backend) is BackendId


def _init_torch():
    """Bind the torch module once it is imported (None before): the tensor types the key accepts; then the _on_torch
    hooks run (functional's registers the custom ops, ops.py, before any tracer can meet a portconv call)."""
    global _torch, _tensor_types, _strided
    torch = sys.modules.get("torch")
    if torch is not None and _torch is None:
        _tensor_types, _strided = (torch.Tensor, torch.nn.Parameter), torch.strided
        _torch = torch
        for hook in _on_torch:
            hook()
    return torch


def on_torch(hook: Callable[[], None]) -> None:
    """Run ``hook()`` once torch is bound here (_init_torch), or now when it already is."""
    _on_torch.append(hook)
    if _torch is not None:
        hook()


def register_traced(forward, backward) -> None:
    """ops.py's entry points for ConvParams: the route of calls on tensors the runners cannot read (``traced``)."""
    traced.forward, traced.backward = forward, backward


def special() -> bool:
    """Note [eager and traced calls]: a tracer, a torch dispatch mode, autocast, a functorch transform or a
    forward-AD level is active (well under a microsecond; False before torch is imported)."""
    torch = _torch or _init_torch()
    if torch is None:
        return False
    return traced_or_transformed() or bool(torch._C._is_any_autocast_enabled())


def plain_eager(input) -> bool:
    """A plain torch.Tensor input (no subclass, array or tensor-like) with no tracer, dispatch mode, functorch
    transform or forward-AD level active: PyTorch's own call is the whole answer there (Note [ATen's modules])."""
    torch = _torch
    return torch is not None and type(input) is torch.Tensor and not traced_or_transformed()


def traced_or_transformed() -> bool:
    """special() but for autocast: a tracer (dynamo first), a torch dispatch mode, a functorch transform or a
    forward-AD level is active (torch is bound)."""
    torch = _torch
    if torch.compiler.is_compiling():
        return True
    c = torch._C
    return bool(c._are_functorch_transforms_active() or c._len_torch_dispatch_stack()
                or torch.autograd.forward_ad._current_level >= 0)


def foreign(*tensors) -> bool:
    """Some operand is a tensor the runners cannot read: a Python-dispatch subclass or a legacy-vmap tensor."""
    torch = _torch
    if torch is None:
        return False
    c = torch._C
    return any(isinstance(t, torch.Tensor) and (c._dispatch_keys(t).has(c.DispatchKey.Python)
                                                or c._functorch.is_legacy_batchedtensor(t)) for t in tensors)


def key(name, input, weight, bias, args: tuple, backend) -> tuple | None:
    """Note [fast path]: the cache key of one call, or None when the call cannot use the cache. ``name`` is any
    hashable that tells the callers' keys apart (a function name; ConvParams for autograd's internal calls)."""
    if _torch is None and _init_torch() is None:
        return _array_call_key(name, input, weight, bias, args, backend)
    tt = _tensor_types
    if type(input) not in tt:
        return _array_call_key(name, input, weight, bias, args, backend)
    if type(weight) not in tt or not _keyable_backend(backend):
        return None
    try:
        if input.layout is not _strided or weight.layout is not _strided:
            return None  # sparse or mkldnn tensors: the slow path decides
        if bias is not None and (type(bias) not in tt or bias.layout is not _strided):
            return None
        args = _key_args(args)
        dev = input.device
        return (name, type(input), input.shape, input.stride(), input.dtype, dev, type(weight), weight.shape,
                weight.stride(), weight.dtype, weight.device, _bias_spec(bias), args, backend, call_state(dev.type))
    except (TypeError, RuntimeError):  # not a strided tensor (sparse, mkldnn), or an argument the cache cannot key
        return None


def _bias_spec(bias) -> tuple | None:
    return None if bias is None else (type(bias), bias.shape, bias.stride(), bias.dtype, bias.device)


def matches(k: tuple, input, weight, bias) -> bool:
    """Whether key() of a torch-tensor call with these tensors would hold what ``k`` (such a key) holds for them and
    for the call state, compared field by field without building the key (Note [module memo]); the name, arguments
    and backend are the caller's to compare."""
    if type(input) is not k[1] or type(weight) is not k[6]:
        return False
    try:
        dev = input.device
        return (input.shape == k[2] and input.stride() == k[3] and input.dtype is k[4] and dev == k[5]
                and weight.shape == k[7] and weight.stride() == k[8] and weight.dtype is k[9]
                and weight.device == k[10] and _bias_spec(bias) == k[11] and call_state(dev.type) == k[14])
    except (TypeError, RuntimeError):  # a tensor without strides (sparse, mkldnn): key() would not key it
        return False


def _array_call_key(name, input, weight, bias, args: tuple, backend) -> tuple | None:
    """Note [fast path] for a call on pyopencl or cupy arrays, or None when the call cannot use the cache."""
    ki, kw = array_key(input), array_key(weight)
    kb = None if bias is None else array_key(bias)
    if ki is None or kw is None or (bias is not None and kb is None) or not _keyable_backend(backend):
        return None
    try:
        args = _key_args(args)
    except TypeError:
        return None
    return name, ki, kw, kb, args, backend, call_state(ARRAY_DEVICE_TYPES[ki[0]])


def get(k: tuple | None):
    if k is None:
        return None
    try:  # least recently used goes first: a hit moves to the end (one lookup, one hash of the key)
        _entries.move_to_end(k)
    except KeyError:
        return None
    return _entries[k]


def put(k: tuple | None, value: tuple) -> None:
    if k is None:
        return
    while _entries and len(_entries) >= knobs.env().plan_cache:
        _entries.popitem(last=False)
    _entries[k] = value


def wants_grad(input, weight, bias) -> bool:
    """Whether autograd must record this call: grad mode on and a torch tensor that requires grad."""
    torch = _torch or sys.modules.get("torch")
    return torch is not None and isinstance(input, torch.Tensor) and torch.is_grad_enabled() and (
        input.requires_grad or weight.requires_grad or (bias is not None and bias.requires_grad))
