"""portconv: one convolution API (forward, grad input, grad weight, grad bias) across CUDA, HIP and OpenCL."""
from .backends import BackendId, Problem
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
from .params import ConvParams
from .plan import Plan, use_backend
from .tune import tune

__version__ = "0.1.0"

__all__ = [
    "Availability", "BackendId", "BackendUnavailable", "ConvError", "ConvParams", "DeviceInfo", "Plan", "Problem",
    "Unsupported", "VendorImportError", "conv1d", "conv2d", "conv3d", "conv_transpose1d", "conv_transpose2d",
    "conv_transpose3d", "convolution", "convolution_backward", "plan", "tune", "use_backend",
]


def __getattr__(name):  # lazy submodules: portconv.nn, .conformance, .rules, .cli, .bench
    import importlib

    if name in ("nn", "conformance", "rules", "cli", "bench"):
        return importlib.import_module(f".{name}", __name__)
    raise AttributeError(f"module 'portconv' has no attribute {name!r}")
