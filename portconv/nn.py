"""portconv.nn: drop-in Conv*/ConvTranspose* modules (state_dict-compatible with torch.nn), convert() and revert()."""
from __future__ import annotations

import copy

import torch
from torch.nn.modules.lazy import LazyModuleMixin

from . import functional as F


class _PortconvMixin:
    """Overrides torch.nn's _conv_forward (forward for ConvTranspose) so parameters, init, state_dict and repr stay
    torch.nn's own. No zero-argument super(): convert() copies these methods into classes derived from subclasses
    of torch.nn's modules (Note [convert])."""

    backend: str | None = None
    _torch_class: type | None = None  # the torch.nn class this one stands for: what revert() restores

    def _init_backend(self, backend):
        self.backend = backend

    def extra_repr(self) -> str:
        s = type(self)._torch_class.extra_repr(self)
        return s + (f", backend={self.backend!r}" if self.backend else "")


class _ConvNd(_PortconvMixin):
    _rank = 0
    _name = ""  # the torch.nn.functional name: conv1d, conv2d, conv3d

    def _conv_forward(self, input, weight, bias):
        if F.aten_module(False, self.groups, self.backend, input):  # Note [ATen's modules]: torch.nn's own call
            return self._torch_class._conv_forward(self, input, weight, bias)
        padding = self.padding
        if self.padding_mode != "zeros":
            input = torch.nn.functional.pad(input, self._reversed_padding_repeated_twice, mode=self.padding_mode)
            padding = 0
        return F.module_convnd(self, self._rank, self._name, input, weight, bias, self.stride, padding, self.dilation,
                               self.groups, self.backend)


class _ConvTransposeNd(_PortconvMixin):
    _rank = 0
    _name = ""  # conv_transpose1d, conv_transpose2d, conv_transpose3d

    def forward(self, input, output_size=None):
        if F.aten_module(True, self.groups, self.backend, input):  # Note [ATen's modules]: torch.nn's own call
            return self._torch_class.forward(self, input, output_size)
        if self.padding_mode != "zeros":
            raise ValueError(f"Only 'zeros' padding mode is supported for {type(self).__name__}")
        output_padding = self._output_padding(input, output_size, self.stride, self.padding, self.kernel_size,
                                              self._rank, self.dilation)
        return F.module_convnd(self, self._rank, self._name, input, self.weight, self.bias, self.stride,
                               self.padding, self.dilation, self.groups, self.backend, True, output_padding)


class Conv1d(_ConvNd, torch.nn.Conv1d):
    _rank, _name = 1, "conv1d"
    _torch_class = torch.nn.Conv1d

    def __init__(self, *args, backend: str | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        self._init_backend(backend)


class Conv2d(_ConvNd, torch.nn.Conv2d):
    _rank, _name = 2, "conv2d"
    _torch_class = torch.nn.Conv2d

    def __init__(self, *args, backend: str | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        self._init_backend(backend)


class Conv3d(_ConvNd, torch.nn.Conv3d):
    _rank, _name = 3, "conv3d"
    _torch_class = torch.nn.Conv3d

    def __init__(self, *args, backend: str | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        self._init_backend(backend)


class ConvTranspose1d(_ConvTransposeNd, torch.nn.ConvTranspose1d):
    _rank, _name = 1, "conv_transpose1d"
    _torch_class = torch.nn.ConvTranspose1d

    def __init__(self, *args, backend: str | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        self._init_backend(backend)


class ConvTranspose2d(_ConvTransposeNd, torch.nn.ConvTranspose2d):
    _rank, _name = 2, "conv_transpose2d"
    _torch_class = torch.nn.ConvTranspose2d

    def __init__(self, *args, backend: str | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        self._init_backend(backend)


class ConvTranspose3d(_ConvTransposeNd, torch.nn.ConvTranspose3d):
    _rank, _name = 3, "conv_transpose3d"
    _torch_class = torch.nn.ConvTranspose3d

    def __init__(self, *args, backend: str | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        self._init_backend(backend)


_OURS = {c._torch_class: c for c in (Conv1d, Conv2d, Conv3d, ConvTranspose1d, ConvTranspose2d, ConvTranspose3d)}
_derived: dict = {}  # derived classes by the class (and base) they are made from


# Note [convert]
# convert() changes the class of each torch.nn convolution module in place (module.__class__), so everything the
# module holds stays as it is: the same Parameter and buffer objects, device, dtype, training mode, hooks,
# padding_mode and state_dict keys; with inplace=False it works on a deep copy and the model is left unchanged.
# torch.nn.Conv2d becomes portconv.nn.Conv2d (and so on for the six classes). A subclass that keeps torch.nn's
# forward (and _conv_forward) becomes a class derived from it, with portconv's methods copied in (isinstance with
# the subclass still holds), named in this module so that pickle finds it in the process that converted. The class
# torch.nn.utils.parametrize puts over a module is rebuilt over the converted class (remove_parametrizations
# restores its first base, which stays a portconv class). A subclass with a forward of its own, a lazy module not
# yet initialised and portconv's own modules are left alone. revert() sets the torch.nn classes back.
def _is_parametrized_class(cls: type) -> bool:
    """The class torch.nn.utils.parametrize injects (one base: the module's own class)."""
    getstate = cls.__dict__.get("__getstate__")
    return len(cls.__bases__) == 1 and getattr(getstate, "__qualname__", "").startswith("_inject_new_class")


def _rebased(cls: type, base: type, **extra) -> type:
    """``cls``'s own attributes over another base (parametrize's class over a converted or reverted module class)."""
    key = (cls, base)
    if key not in _derived:
        attrs = {k: v for k, v in vars(cls).items() if k not in ("__dict__", "__weakref__")}
        _derived[key] = type(cls.__name__, (base,), {**attrs, **extra})
    return _derived[key]


def _converted_class(cls: type) -> type | None:
    """The class a module of class ``cls`` becomes under convert(), or None when it is not converted."""
    if cls in _OURS:
        return _OURS[cls]
    if _is_parametrized_class(cls):
        inner = _converted_class(cls.__bases__[0])
        return None if inner is None else _rebased(cls, inner, _torch_class=cls)
    if issubclass(cls, _PortconvMixin) or issubclass(cls, LazyModuleMixin):
        return None
    base = next((b for b in _OURS if issubclass(cls, b)), None)
    if base is None or cls.forward is not base.forward or getattr(cls, "_conv_forward", None) is not getattr(
            base, "_conv_forward", None):
        return None
    if cls not in _derived:
        ours = _OURS[base]
        attrs = {k: v for c in reversed(ours.__mro__[:ours.__mro__.index(base)]) for k, v in vars(c).items()
                 if not k.startswith("__") and k != "_init_backend"}
        name = f"_converted_{cls.__module__}.{cls.__qualname__}".replace(".", "_").replace("<", "_").replace(">", "_")
        attrs.update(_torch_class=cls, __module__=__name__, __qualname__=name, __doc__=cls.__doc__)
        _derived[cls] = globals()[name] = type(cls.__name__, (cls,), attrs)
    return _derived[cls]


def _reverted_class(cls: type) -> type | None:
    """The torch.nn class a converted module goes back to, or None."""
    if "_torch_class" in cls.__dict__:
        return cls.__dict__["_torch_class"]
    if _is_parametrized_class(cls):
        inner = _reverted_class(cls.__bases__[0])
        return None if inner is None else _rebased(cls, inner)
    return None


def convert(module: torch.nn.Module, backend: str | None = None, inplace: bool = False) -> torch.nn.Module:
    """``module`` with every torch.nn Conv1d/2d/3d and ConvTranspose1d/2d/3d (and subclass that keeps torch.nn's
    forward) running on portconv, ``backend`` for all of them (None: portconv's plan). Note [convert]."""
    if not inplace:
        module = copy.deepcopy(module)
    for m in module.modules():
        cls = _converted_class(type(m))
        if cls is not None:
            m.__class__ = cls
            m.backend = backend
    return module


def revert(module: torch.nn.Module, inplace: bool = False) -> torch.nn.Module:
    """``module`` with every portconv convolution module back to its torch.nn class (Note [convert])."""
    if not inplace:
        module = copy.deepcopy(module)
    for m in module.modules():
        cls = _reverted_class(type(m))
        if cls is not None:
            m.__class__ = cls
            m.__dict__.pop("backend", None)
    return module


__all__ = ["Conv1d", "Conv2d", "Conv3d", "ConvTranspose1d", "ConvTranspose2d", "ConvTranspose3d", "convert",
           "revert"]
