"""Note [ctypes toolchain] without a GPU: which libnvrtc is taken (a table), and the NVRTC wrapper building a kernel
to a cubin and to PTX and returning the log of a failed build (libnvrtc from pip; a failure under
PORTCONV_REQUIRE_NVRTC=1, else a skip)."""
from __future__ import annotations

import os

import pytest

from portconv.backends.simt import nvidia
from portconv.errors import VendorImportError

PICK_TABLE = [
    # (libraries found, the driver's CUDA major or None, the one taken)
    (["/w/nvidia/cu13/lib/libnvrtc.so.13", "/w/nvidia/cuda_nvrtc/lib/libnvrtc.so.12"], 13,
     "/w/nvidia/cu13/lib/libnvrtc.so.13"),
    (["/w/nvidia/cu13/lib/libnvrtc.so.13", "/w/nvidia/cuda_nvrtc/lib/libnvrtc.so.12"], 12,
     "/w/nvidia/cuda_nvrtc/lib/libnvrtc.so.12"),  # a CUDA 12 driver cannot run NVRTC 13's cubins
    (["/usr/local/cuda/lib64/libnvrtc.so.12.4.127"], 13, "/usr/local/cuda/lib64/libnvrtc.so.12.4.127"),
    (["/w/nvidia/cu13/lib/libnvrtc.so.13"], 12, None),  # nothing the driver runs
    (["/w/nvidia/cu13/lib/libnvrtc.so.13", "/w/nvidia/cuda_nvrtc/lib/libnvrtc.so.12"], None,
     "/w/nvidia/cu13/lib/libnvrtc.so.13"),  # no driver to ask: the newest
    ([], 13, None),
]


@pytest.mark.parametrize("paths,major,want", PICK_TABLE)
def test_the_newest_nvrtc_the_driver_runs_is_taken(paths, major, want):
    assert nvidia.pick_nvrtc(paths, major) == want


def test_candidates_are_nvrtc_libraries_only():
    for path in nvidia.nvrtc_candidates():
        name = os.path.basename(path)
        assert name.startswith("libnvrtc") and "builtins" not in name and "alt" not in name, path


@pytest.fixture(scope="module")
def rtc():
    try:
        return nvidia.nvrtc()
    except VendorImportError as e:
        if os.environ.get("PORTCONV_REQUIRE_NVRTC") == "1":
            pytest.fail(f"PORTCONV_REQUIRE_NVRTC=1: {e}", pytrace=False)
        pytest.skip(f"{e} (set PORTCONV_REQUIRE_NVRTC=1 to make this a failure)")


KERNEL = 'extern "C" __global__ void k(float* x) { x[threadIdx.x] = 2.0f * x[threadIdx.x]; }'


def test_nvrtc_builds_cubins_and_ptx(rtc):
    assert rtc.version >= (12, 0) and 90 in rtc.archs()
    rc, log, cubin = rtc.compile(KERNEL, "k.cu", ["-arch=sm_90"], "cubin")
    assert rc == 0 and cubin[:4] == b"\x7fELF", log
    rc, log, ptx = rtc.compile(KERNEL, "k.cu", ["-arch=compute_90"], "ptx")
    assert rc == 0 and b".entry k" in ptx and ptx.endswith(b"\0") and ptx.count(b"\0") == 1, log


def test_a_failed_build_returns_its_log(rtc):
    rc, log, code = rtc.compile(KERNEL.replace("2.0f", "undeclared_name"), "bad.cu", ["-arch=sm_90"], "cubin")
    assert rc != 0 and code == b"" and "undeclared_name" in log and "bad.cu" in log
