"""The wheel carries the kernel folders (cuda/, hip/, opencl/) and works when installed outside the repository."""
from __future__ import annotations

import os
import pathlib
import subprocess
import sys
import sysconfig
import zipfile

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> pathlib.Path:
    out = tmp_path_factory.mktemp("wheel")
    r = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-w", str(out),
                        str(ROOT)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    (whl,) = out.glob("portconv-*.whl")
    return whl


def test_wheel_contains_every_kernel_source(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    for vendor in ("cuda", "hip", "opencl"):
        src = {p.relative_to(ROOT).as_posix() for p in (ROOT / vendor).rglob("*") if p.is_file()}
        assert src, f"no {vendor} sources in the repository"
        missing = {s for s in src if f"portconv/_src/{s}" not in names}
        assert not missing, f"not in the wheel: {sorted(missing)}"
    assert "portconv/bench/suite.json" in names  # `portconv bench` works from an installed wheel


def test_installed_wheel_runs_a_conv_outside_the_repo(wheel, tmp_path):
    env_dir = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(env_dir)], check=True, timeout=120)
    py = env_dir / "bin" / "python"
    # torch and pyopencl come from this interpreter's site-packages through a plain path entry (a .pth line does not
    # run the parent's editable-install hooks), so the only portconv the new venv can import is the wheel's.
    purelib = subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             capture_output=True, text=True, check=True).stdout.strip()
    parent = sysconfig.get_paths()["purelib"]
    pathlib.Path(purelib, "parent_site.pth").write_text(parent + "\n")
    r = subprocess.run([str(py), "-m", "pip", "install", "--no-deps", "--no-index", "--force-reinstall", str(wheel)],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    code = (
        "import torch, portconv, portconv.sources as s\n"
        "assert 'site-packages' in str(s.folder('opencl')), s.folder('opencl')\n"
        "x = torch.randn(2, 3, 8, 8); w = torch.randn(4, 3, 3, 3)\n"
        "y = portconv.conv2d(x, w, padding=1, backend='opencl')\n"
        "ref = torch.nn.functional.conv2d(x.double(), w.double(), padding=1)\n"
        "print((y.double() - ref).abs().max().item())\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    r = subprocess.run([str(py), "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=300, env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    assert float(r.stdout.strip().splitlines()[-1]) < 1e-4
