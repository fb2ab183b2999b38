"""Exceptions portconv raises; messages follow PyTorch's where PyTorch has one."""


class ConvError(RuntimeError):
    """Invalid convolution arguments (PyTorch raises RuntimeError with the same text)."""


class Unsupported(RuntimeError):
    """A backend cannot run this problem; ``reason`` says why."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


class BackendUnavailable(RuntimeError):
    """A requested backend is absent or cannot run the problem; the message carries every reason."""


class VendorImportError(ImportError):
    """A vendor module (pyopencl, cupy) is missing; the message names what to pip install."""
