"""Every kernel family of opencl/*.cl under Oclgrind, the OpenCL device simulator (Note [oclgrind]). No GPU needed;
Oclgrind must be installed (apt-get install oclgrind); a failure under PORTCONV_REQUIRE_OCLGRIND=1 (CI), else a skip."""
from __future__ import annotations

import json
import os
import pathlib
import shutil
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]

# Note [oclgrind]
# Oclgrind simulates an OpenCL 1.2 device and checks every memory access of every work-item. Its ICD is loaded as the
# only vendor (OCL_ICD_VENDORS names a folder holding oclgrind.icd) in a child process, which runs conformance cases
# on it (PORTCONV_OPENCL_DEVICE=oclgrind: its platform's name) and writes what Oclgrind reports to OCLGRIND_LOG; any
# line there fails the test. Two runs:
#   'races': invalid and out-of-bounds accesses (always checked) and data races in local and global memory
#     (OCLGRIND_DATA_RACES), with results NaN-poisoned as in every conformance run;
#   'uninitialized': values derived from unwritten memory reaching global memory, a branch or an address
#     (OCLGRIND_UNINITIALIZED). Oclgrind 21.10's plugin stops with "Unsupported instruction: freeze" on optimised
#     code, so this run builds with -cl-opt-disable; and it does not count bytes written by clEnqueueFillBuffer as
#     written, which is how PORTCONV_POISON fills results, so this run does not poison.
# Programs are built into a fresh cache folder (pyopencl's cache key does not see OCLGRIND_BUILD_OPTIONS). CASES is
# the smallest set of conformance cases that reaches every kernel family on Oclgrind (plans there are a GPU's: no CPU
# tiles), float32, each case's checked call once; about 30 s a run on two cores.
CASES = [  # (conformance case id, Options.opencl_dense): the families Oclgrind's plans launch for it
    ("conv1d-n1c3k4-i1-f3-s1-p1-d1-g1-b-m010-chlast", None),  # ig_fwd ig_bwd_weight
    ("conv1d-n1c3k4-i1-f3-s1-p1-d1-g1-b-m010-chlast", "direct"),  # conv.cl fwd bwd_weight
    ("conv1d-n1c4k4-i13-f3-s1-psame-d1-g4-b-m111-contig", None),  # dw_fwd dw_bwd_data dw_bwd_weight bias_grad
    ("conv1d-n1c3k4-i13-f1-s3-p2-d3-g1-nb-m110-contig", None),  # conv.cl bwd_data (narrow backward-data)
    ("conv1d-n1c3k4-i13-f13-s1-pvalid-d1-g1-b-m111-chlast", None),  # ig_bwd_data
    ("conv3d-n3c2k3-i5x6x7-f1x1x1-s1x2x2-p1x0x1-d1x2x1-g1-nb-m111-strided", None),  # ig_finalize (split reduction)
    ("model-mobilenetv2-dw3x3-s1-nhwc", None),  # dw_cl_fwd dw_cl_bwd_data dw_cl_bwd_weight dw_finalize
    ("conv2d-n2c3k3-i12x11-f7x7-s1-p3-d1-g3-b-m110-chlast", None),  # clw_fwd_s1 clw_bwd_data_s1 clw_bwd_weight_s1
    ("conv2d-n3c4k4-i7x9-f2x2-s2-p1-d1-g4-b-m111-chlast", None),  # clw_fwd_s2 clw_bwd_data_s2 clw_bwd_weight_s2
]
FAMILIES = {  # launch.stat_name of every kernel in opencl/*.cl
    "conv.cl": ("fwd", "bwd_data", "bwd_weight", "bias_grad"),
    "igemm.cl": ("ig_fwd", "ig_bwd_data", "ig_bwd_weight", "ig_finalize"),
    "depthwise.cl NCHW": ("dw_fwd", "dw_bwd_data", "dw_bwd_weight", "dw_finalize"),
    "depthwise.cl channels-last": ("dw_cl_fwd", "dw_cl_bwd_data", "dw_cl_bwd_weight"),
    "clw.cl": ("clw_fwd_s1", "clw_fwd_s2", "clw_bwd_data_s1", "clw_bwd_data_s2", "clw_bwd_weight_s1",
               "clw_bwd_weight_s2", "clw_finalize"),
}
RUNS = {  # run -> (Oclgrind's environment, PORTCONV_POISON)
    "races": ({"OCLGRIND_DATA_RACES": "1"}, True),
    "uninitialized": ({"OCLGRIND_UNINITIALIZED": "1", "OCLGRIND_BUILD_OPTIONS": "-cl-opt-disable"}, False),
}

_DRIVER = r"""
import json, sys
import portconv
from portconv.backends.opencl import runtime as rt
from portconv.conformance import cases as C
from portconv.conformance.runner import run_case

wanted, poison = json.loads(sys.argv[1]), sys.argv[2] == "1"
by_id = {c.id: c for c in C.all_cases()}
device = rt.info(*rt.default_index())
assert "oclgrind" in device.name.lower(), device.describe()
for case_id, dense in wanted:
    with portconv.options(opencl_dense=dense):
        r = run_case(by_id[case_id], "opencl", "float32", poison=poison, warm=False)
    print(json.dumps({"id": case_id, "dense": dense, "status": r.status, "errors": r.errors()[:3]}), flush=True)
print(json.dumps({"launched": sorted(k for k, v in rt.stats.items() if v)}))
"""

# A kernel with one error of each kind: Oclgrind, as set up here, must report all three.
_CANARY = r"""
import numpy as np, pyopencl as cl
dev = next(d for p in cl.get_platforms() if "oclgrind" in p.name.lower() for d in p.get_devices())
ctx = cl.Context([dev])
queue = cl.CommandQueue(ctx)
prg = cl.Program(ctx, '''
__kernel void canary(__global float *out, __global const float *in) {
    __local float tile[16];
    float unset[2];
    const int i = get_local_id(0);
    tile[i] = in[i];
    out[16] = tile[(i + 1) % 16];  /* no barrier between the write and the read of tile: a race */
    out[i] = in[i + 16] + unset[i % 2];  /* in has 16 floats; unset is never written */
}''').build()
src = cl.Buffer(ctx, cl.mem_flags.READ_ONLY | cl.mem_flags.COPY_HOST_PTR, hostbuf=np.ones(16, np.float32))
prg.canary(queue, (16,), (16,), cl.Buffer(ctx, cl.mem_flags.WRITE_ONLY, 17 * 4), src).wait()
"""


def _icd_library() -> pathlib.Path | None:
    """Oclgrind's ICD library, next to its launcher's prefix (Debian: /usr/lib/oclgrind/)."""
    exe = shutil.which("oclgrind")
    if exe is None:
        return None
    prefix = pathlib.Path(exe).resolve().parents[1]
    for folder in ("lib/oclgrind", "lib", "lib64", "lib/x86_64-linux-gnu"):
        lib = prefix / folder / "liboclgrind-rt-icd.so"
        if lib.is_file():
            return lib
    return None


@pytest.fixture(scope="module")
def icd() -> pathlib.Path:
    lib = _icd_library()
    if lib is not None:
        return lib
    why = ("Oclgrind's launcher and ICD library (liboclgrind-rt-icd.so) were not found: "
           "apt-get install -y --no-install-recommends oclgrind")
    if os.environ.get("PORTCONV_REQUIRE_OCLGRIND") == "1":
        pytest.fail(f"PORTCONV_REQUIRE_OCLGRIND=1: {why}", pytrace=False)
    pytest.skip(f"{why} (set PORTCONV_REQUIRE_OCLGRIND=1 to make this a failure)")


def _under_oclgrind(icd: pathlib.Path, tmp: pathlib.Path, checks: dict, args: list[str]) -> tuple[str, str]:
    """(stdout, Oclgrind's log) of ``python args`` with Oclgrind as the only OpenCL vendor."""
    vendors = tmp / "vendors"
    vendors.mkdir()
    (vendors / "oclgrind.icd").write_text(f"{icd}\n")
    log = tmp / "oclgrind.log"
    env = {**os.environ, **checks, "OCL_ICD_VENDORS": str(vendors), "OCLGRIND_LOG": str(log),
           "PORTCONV_OPENCL_DEVICE": "oclgrind", "PORTCONV_CACHE_DIR": str(tmp / "cache")}
    r = subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=300, cwd=ROOT, env=env)
    report = log.read_text() if log.exists() else ""
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-4000:] + report[:4000]
    return r.stdout, report


@pytest.mark.parametrize("run", list(RUNS))
def test_every_kernel_family_is_clean_under_oclgrind(run, icd, tmp_path):
    checks, poison = RUNS[run]
    out, report = _under_oclgrind(icd, tmp_path, {**checks, "PORTCONV_POISON": "1" if poison else "0"},
                                  ["-c", _DRIVER, json.dumps(CASES), "1" if poison else "0"])
    rows = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    failed = [row for row in rows[:-1] if row["status"] != "pass"]
    assert len(rows) == len(CASES) + 1 and not failed, out
    launched = set(rows[-1]["launched"])
    missing = {f: [k for k in ks if k not in launched] for f, ks in FAMILIES.items() if not set(ks) <= launched}
    assert not missing, f"kernels these cases no longer reach on Oclgrind: {missing}"
    assert not report.strip(), f"Oclgrind ({run}) reports:\n{report[:6000]}"


def test_oclgrind_reports_each_kind_of_error(icd, tmp_path):
    """The set-up can fail: a kernel with an out-of-bounds read, a data race and an unwritten value is reported for
    each of them."""
    checks = {k: v for c, _ in RUNS.values() for k, v in c.items()}
    _, report = _under_oclgrind(icd, tmp_path, checks, ["-c", _CANARY])
    for kind in ("Invalid read of size 4 at global memory", "data race at local memory",
                 "Uninitialized value written to global memory"):
        assert kind in report, f"{kind!r} not in Oclgrind's report:\n{report[:3000]}"
