"""Environment knobs, gathered in one place and read on use (so tests and context managers can change them)."""
from __future__ import annotations

import os

# name -> help text, printed by `portconv devices`
KNOBS = {
    "PORTCONV_BACKEND": "force one backend for every call (opencl, cuda, hip, cudnn, miopen, aten)",
    "PORTCONV_DISABLE": "comma-separated backends the planner must not choose",
    "PORTCONV_OPENCL_DEVICE": ("OpenCL device for CPU tensors: 'P:D' indices, 'gpu', 'cpu' or a substring of the "
                               "platform/device name (default: the first GPU, else the first CPU device)"),
    "PORTCONV_OPENCL_DENSE": ("OpenCL kernels for dense (not depthwise) problems: 'igemm' (tiled implicit GEMM) or "
                              "'direct' (default: igemm on GPUs, the measured choice on CPUs); read when a plan is "
                              "made (part of the plan cache's key)"),
    "PORTCONV_OPENCL_TC": ("tensor-core products in the OpenCL implicit-GEMM tiles (Note [OpenCL tensor cores]): "
                           "'off', 'ptx' or 'portable' (the same tile with plain OpenCL C products, any device); "
                           "default: ptx on NVIDIA GPUs of sm_80 and newer (float32 only where torch allows TF32 for "
                           "cuDNN convolutions), else off; read when a plan is made"),
    "PORTCONV_POISON": "1: fill outputs with NaN before kernels run (the conformance suite sets it)",
    "PORTCONV_CACHE_DIR": "directory for compiled kernels and tuning results (default ~/.cache/portconv)",
    "PORTCONV_TUNE": "1: time candidate algorithms once per problem and persist the winner",
    "PORTCONV_CUDA_PDL": ("0: launch a replayed split finalize the ordinary way instead of as a dependent launch "
                          "(Note [dependent launch], sm_90 and newer); read when the CUDA driver is first loaded"),
}


def get(name: str, default: str | None = None) -> str | None:
    assert name in KNOBS, name
    v = os.environ.get(name)
    return v if v not in (None, "") else default


def backend() -> str | None:
    return get("PORTCONV_BACKEND")


def disabled() -> frozenset[str]:
    return frozenset(s.strip().lower() for s in (get("PORTCONV_DISABLE") or "").split(",") if s.strip())


def poison() -> bool:
    return get("PORTCONV_POISON", "0") not in ("0", "false", "no")


def tune() -> bool:
    return get("PORTCONV_TUNE", "0") not in ("0", "false", "no")


def cache_dir() -> str:
    return get("PORTCONV_CACHE_DIR") or os.path.join(os.path.expanduser("~"), ".cache", "portconv")
