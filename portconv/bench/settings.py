"""What a benchmark ran under: versions, torch's cuDNN/TF32 settings (set and restored), knobs, the git revision."""
from __future__ import annotations

import contextlib
import importlib.metadata
import os
import pathlib
import platform
import subprocess
import sys

from .. import knobs, native

_DISTS = ("torch", "numpy", "pyopencl", "pocl-binary-distribution", "cupy-cuda12x", "cupy-cuda13x", "cupy-rocm-7-0",
          "ml_dtypes", "matplotlib")


def _read(getter):
    try:
        return getter()
    except (RuntimeError, AttributeError) as e:  # legacy getters raise once the new per-op flags differ
        return f"unreadable: {e}"


def torch_flags() -> dict:
    """torch's convolution-relevant switches as they are now."""
    import torch

    cudnn = torch.backends.cudnn
    conv = getattr(cudnn, "conv", None)
    out = {"cudnn.enabled": cudnn.enabled, "cudnn.benchmark": cudnn.benchmark,
           "cudnn.deterministic": cudnn.deterministic, "num_threads": torch.get_num_threads()}
    if conv is not None and hasattr(conv, "fp32_precision"):
        out["cudnn.conv.fp32_precision"] = _read(lambda: conv.fp32_precision)
        out["cudnn.fp32_precision"] = _read(lambda: cudnn.fp32_precision)
        out["backends.fp32_precision"] = _read(lambda: torch.backends.fp32_precision)
        out["cuda.matmul.fp32_precision"] = _read(lambda: torch.backends.cuda.matmul.fp32_precision)
    else:
        out["cudnn.allow_tf32"] = _read(lambda: cudnn.allow_tf32)
        out["cuda.matmul.allow_tf32"] = _read(lambda: torch.backends.cuda.matmul.allow_tf32)
    return out


def conv_tf32_default() -> tuple[bool, str]:
    """Whether cuDNN convolutions use TF32 for float32 now (Note [TF32 policy])."""
    import torch

    from ..rules.precision import conv_tf32

    return conv_tf32(torch)


@contextlib.contextmanager
def torch_variant(benchmark: bool | None = None, ieee: bool = False):
    """cudnn.benchmark and float32 convolution precision inside the block; restored after.

    ``ieee`` sets torch.backends.cudnn.conv.fp32_precision = 'ieee' where torch has it, else allow_tf32 = False.
    Yields the settings as text for the report.
    """
    import torch

    cudnn = torch.backends.cudnn
    conv = getattr(cudnn, "conv", None)
    new_api = conv is not None and hasattr(conv, "fp32_precision")
    old_bench = cudnn.benchmark
    old_prec = (conv.fp32_precision if new_api else cudnn.allow_tf32) if ieee else None
    said = []
    try:
        if benchmark is not None:
            cudnn.benchmark = benchmark
            said.append(f"torch.backends.cudnn.benchmark = {benchmark}")
        if ieee:
            if new_api:
                conv.fp32_precision = "ieee"
                said.append("torch.backends.cudnn.conv.fp32_precision = 'ieee'")
            else:
                cudnn.allow_tf32 = False
                said.append("torch.backends.cudnn.allow_tf32 = False (this torch has no cudnn.conv.fp32_precision)")
        yield said or ["torch defaults as found"]
    finally:
        cudnn.benchmark = old_bench
        if ieee:
            if new_api:
                conv.fp32_precision = old_prec
            else:
                cudnn.allow_tf32 = old_prec


@contextlib.contextmanager
def no_poison():
    """Poisoning off inside the block (a NaN fill per call would be timed with the kernels); yields whether it was
    on."""
    was = knobs.env().poison
    with knobs.with_env(poison=False):
        yield was


def git_revision() -> str | None:
    root = pathlib.Path(__file__).resolve().parents[2]
    if not (root / ".git").exists():
        return None
    try:
        rev = subprocess.run(["git", "-C", str(root), "rev-parse", "--short", "HEAD"], capture_output=True,
                             text=True, timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return (rev + ("-dirty" if dirty else "")) if rev else None


def loadavg() -> list[float] | None:
    """The host's 1/5/15-minute load averages: other work on the machine moves CPU-side timings."""
    try:
        return [round(v, 2) for v in os.getloadavg()]
    except (OSError, AttributeError):
        return None


def environment() -> dict:
    import torch

    from .. import __version__

    vers = {"python": platform.python_version(), "portconv": __version__}
    for dist in _DISTS:
        try:
            vers[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            continue
    vers["torch.version.cuda"] = torch.version.cuda
    if getattr(torch.version, "hip", None):
        vers["torch.version.hip"] = torch.version.hip
    if torch.cuda.is_available():
        try:
            vers["cudnn"] = torch.backends.cudnn.version()
        except RuntimeError as e:
            vers["cudnn"] = f"error: {e}"
    return {"versions": vers, "git": git_revision(), "cpus": os.cpu_count(), "loadavg": loadavg(),
            "platform": platform.platform(), "argv": sys.argv,
            # the knobs as set, and the options in force, so a report says which kernels it timed
            "knobs": knobs.raw(), "options": knobs.options().describe(), "native": native.status(),
            "torch_flags": torch_flags()}

def check_device(device: str | None) -> None:
    """--device checked: a torch device of type cpu or cuda that this torch can reach (ValueError otherwise)."""
    import torch

    if device is None:
        return
    try:
        dev = torch.device(device)
    except RuntimeError as e:
        raise ValueError(f"--device {device!r}: {e}") from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"--device {device!r}: this PyTorch ({torch.__version__}) sees no CUDA device")
    if dev.type not in ("cpu", "cuda"):
        raise ValueError(f"--device {device!r}: the bench runs on 'cpu' or 'cuda' devices")
