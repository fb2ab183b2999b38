"""portconv.nn: drop-in Conv*/ConvTranspose* modules, state_dict-compatible with torch.nn, running on portconv."""
from __future__ import annotations

import torch

from . import functional as F


class _PortconvMixin:
    """Overrides torch.nn's _conv_forward so parameters, init, state_dict and repr stay torch.nn's own."""

    backend: str | None = None

    def _init_backend(self, backend):
        self.backend = backend

    def extra_repr(self) -> str:
        s = super().extra_repr()
        return s + (f", backend={self.backend!r}" if self.backend else "")

    def _padded(self, input):
        if self.padding_mode == "zeros":
            return input, self.padding
        pad = self._reversed_padding_repeated_twice
        return torch.nn.functional.pad(input, pad, mode=self.padding_mode), 0


class _ConvNd(_PortconvMixin):
    _fn = None

    def _conv_forward(self, input, weight, bias):
        x, padding = self._padded(input)
        return type(self)._fn(x, weight, bias, self.stride, padding, self.dilation, self.groups, backend=self.backend)


class Conv1d(_ConvNd, torch.nn.Conv1d):
    _fn = staticmethod(F.conv1d)

    def __init__(self, *args, backend: str | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        self._init_backend(backend)


class Conv2d(_ConvNd, torch.nn.Conv2d):
    _fn = staticmethod(F.conv2d)

    def __init__(self, *args, backend: str | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        self._init_backend(backend)


class Conv3d(_ConvNd, torch.nn.Conv3d):
    _fn = staticmethod(F.conv3d)

    def __init__(self, *args, backend: str | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        self._init_backend(backend)


class _ConvTransposeNd(_PortconvMixin):
    _fn = None
    _rank = 0

    def forward(self, input, output_size=None):
        if self.padding_mode != "zeros":
            raise ValueError(f"Only 'zeros' padding mode is supported for {type(self).__name__}")
        output_padding = self._output_padding(input, output_size, self.stride, self.padding, self.kernel_size,
                                              self._rank, self.dilation)
        return type(self)._fn(input, self.weight, self.bias, self.stride, self.padding, output_padding, self.groups,
                              self.dilation, backend=self.backend)


class ConvTranspose1d(_ConvTransposeNd, torch.nn.ConvTranspose1d):
    _fn = staticmethod(F.conv_transpose1d)
    _rank = 1

    def __init__(self, *args, backend: str | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        self._init_backend(backend)


class ConvTranspose2d(_ConvTransposeNd, torch.nn.ConvTranspose2d):
    _fn = staticmethod(F.conv_transpose2d)
    _rank = 2

    def __init__(self, *args, backend: str | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        self._init_backend(backend)


class ConvTranspose3d(_ConvTransposeNd, torch.nn.ConvTranspose3d):
    _fn = staticmethod(F.conv_transpose3d)
    _rank = 3

    def __init__(self, *args, backend: str | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        self._init_backend(backend)


__all__ = ["Conv1d", "Conv2d", "Conv3d", "ConvTranspose1d", "ConvTranspose2d", "ConvTranspose3d"]
