"""portconv: one convolution API (forward, grad input, grad weight, grad bias) across CUDA, HIP and OpenCL."""
from .backends import BackendId
from .device import Availability, DeviceInfo
from .errors import BackendUnavailable, ConvError, Unsupported, VendorImportError
from .functional import (
    conv1d,
    conv2d,
    conv3d,
    conv_transpose1d,
    conv_transpose2d,
    conv_transpose3d,
    convolution,
    convolution_backward,
    plan,
)
from .knobs import Options
from .knobs import use_options as options
from .params import ConvParams
from .planner import Plan, tune, use_backend
from .problem import Problem

__version__ = "0.1.0"

__all__ = [
    "Availability", "BackendId", "BackendUnavailable", "ConvError", "ConvParams", "DeviceInfo", "Options", "Plan",
    "Problem", "Unsupported", "VendorImportError", "check_forward", "conv1d", "conv2d", "conv3d", "conv_transpose1d",
    "conv_transpose2d", "conv_transpose3d", "convert", "convolution", "convolution_backward", "custom_forward",
    "options", "plan", "revert", "tune", "use_backend",
]


def __getattr__(name):  # lazy submodules: portconv.nn, .conformance, .rules, .cli, .bench
    import importlib

    if name in ("convert", "revert"):  # portconv.nn imports torch: loaded on first use
        return getattr(importlib.import_module(".nn", __name__), name)
    if name in ("custom_forward", "check_forward"):  # portconv.custom: Note [custom forward]
        return getattr(importlib.import_module(".custom", __name__), name)
    if name in ("nn", "conformance", "rules", "cli", "bench"):
        return importlib.import_module(f".{name}", __name__)
    raise AttributeError(f"module 'portconv' has no attribute {name!r}")
