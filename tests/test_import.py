"""`import portconv` needs only torch and numpy: no vendor module (pyopencl, cupy) is imported by it."""
from __future__ import annotations

import subprocess
import sys

VENDOR = ("pyopencl", "cupy", "cupyx", "pycuda", "hip")


def _imported_after(code: str) -> set[str]:
    probe = (f"import sys\n{code}\n"
             f"print(','.join(sorted({{m.split('.')[0] for m in sys.modules}} & set({VENDOR!r}))))")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return {m for m in out.stdout.strip().split(",") if m}


def test_import_loads_no_vendor_module():
    assert _imported_after("import portconv, portconv.nn, portconv.planner, portconv.functional") == set()


def test_planning_on_aten_loads_no_vendor_module():
    code = ("import torch, portconv\n"
            "x = torch.randn(1, 2, 5, 5); w = torch.randn(3, 2, 3, 3)\n"
            "portconv.conv2d(x, w, backend='aten')")
    assert _imported_after(code) == set()


def test_vendor_import_error_names_pip_extra():
    from portconv.errors import VendorImportError

    assert issubclass(VendorImportError, ImportError)
