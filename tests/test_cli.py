"""The `portconv` command line, in-process and in a subprocess: devices, conv --verify, explain, conform, errors."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from conftest import require_backend

from portconv import cli, native
from portconv.backends import BackendId, all_ids
from portconv.conformance import cases as C
from portconv.knobs import KNOBS

SMALL = ["-n", "2", "-c", "4", "-k", "6", "-H", "7", "-W", "9", "-g", "2", "-b", "1"]


def _run(capsys, *argv) -> tuple[int, str, str]:
    rc = cli.main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


def _sub(*argv, timeout=300) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONWARNINGS="ignore")
    return subprocess.run([sys.executable, "-m", "portconv.cli", *argv], capture_output=True, text=True,
                          timeout=timeout, env=env)


def test_devices_lists_every_backend_and_knob(capsys):
    rc, out, _ = _run(capsys, "devices")
    assert rc == 0
    for bid in all_ids():
        assert f"  {bid.value} " in out
    assert "aten     available" in out
    assert f"native executor (Note [native executor]; the cuda and hip kernels on NVIDIA): {native.status()}" in out
    for k in KNOBS:
        assert k.name in out and k.help[:40] in out
    rc, out, _ = _run(capsys, "devices", "--json")
    data = json.loads(out)
    assert [r["backend"] for r in data["backends"]] == [b.value for b in BackendId]
    assert all(r["reason"] for r in data["backends"])  # available or not, always with a reason
    assert set(data["knobs"]) == {k.name for k in KNOBS} and data["native"] == native.status()


@pytest.mark.parametrize("extra", [[], ["-F", "fwd,bwd-weight", "--layout", "NHWC"], ["--mask", "101", "-t", "-i", "2"],
                                   ["--dtype", "fp64", "--layout", "strided", "-m", "trans", "-Y", "1", "-X", "1",
                                    "-u", "2", "-v", "2"]])
def test_conv_verify_on_aten(capsys, extra):
    rc, out, _ = _run(capsys, "conv", *SMALL, "--backend", "aten", "-V", *extra)
    assert rc == 0, out
    assert "plan:" in out and "backend      aten (forced): aten:" in out
    assert "PASS" in out and "FAIL" not in out
    assert "reproduce:\n  portconv conv " in out and "portconv.convolution(" in out
    if "-t" in extra:
        assert "median ms" in out


def test_conv_verify_each_requested_backend(capsys, requested_backends):
    for name in requested_backends:
        require_backend(name)
        for argv in (SMALL, ["--spatial_dim", "3", "-n", "1", "-c", "2", "-k", "3", "--in_d", "4", "-H", "5", "-W",
                             "6", "--fil_d", "2", "-y", "2", "-x", "2", "-z", "same", "-b", "1"],
                     ["--spatial_dim", "1", "-n", "2", "-c", "3", "-k", "4", "-W", "17", "-x", "5", "-v", "2", "-q",
                      "2", "-j", "2"]):
            rc, out, _ = _run(capsys, "conv", *argv, "--backend", name, "-V", "-t", "-i", "1")
            assert rc == 0, out
            assert out.count("PASS") >= 3 and "FAIL" not in out


def test_conv_reproducer_round_trips(capsys):
    """The repro line printed by `conv` (and by conform's failures) rebuilds the same case, hence the same data."""
    parser = cli.build_parser()
    for case in C.all_cases()[::7]:
        args = parser.parse_args(["conv", *case.cli_args()])
        assert cli.case_from_args(args, args.mask).key == case.key, case.id
    rc, out, _ = _run(capsys, "conv", *SMALL, "--backend", "aten", "-F", "2")
    line = next(ln for ln in out.splitlines() if ln.strip().startswith("portconv conv"))
    assert "-F 2" in line and "--mask" not in line
    rc2, out2, _ = _run(capsys, *line.split()[1:])
    assert rc2 == 0 and "grad_input" in out2 and "grad_weight" not in out2


def test_explain_prints_plan_and_aten_model(capsys):
    rc, out, _ = _run(capsys, "explain", *SMALL, "--layout", "NHWC")
    assert rc == 0
    assert "portconv plan:" in out and "output       [" in out
    assert "ATen model (portconv.rules):" in out and "torch on this machine:" in out
    rc, out, _ = _run(capsys, "explain", *SMALL, "--backend", "aten")
    assert rc == 0 and "backend      aten (forced)" in out


def test_conform_tiny_subset(capsys, tmp_path, requested_backends):
    for name in requested_backends:
        require_backend(name)
        path = tmp_path / f"{name}.json"
        rc, out, err = _run(capsys, "conform", "--backend", name, "--subset", "--filter", "model-dcgan", "--filter",
                            "conv1d-n2c3k4-i13-f3", "--no-gradcheck", "--json", str(path))
        assert rc == 0, out
        assert "PASS:" in out and "dtype" in out and "grad_weight" in out
        data = json.loads(path.read_text())
        assert data["ok"] and data["backend"] == name and set(data["dtypes"]) == {"float32", "float64"}
        assert all("model-dcgan" in c["id"] or "conv1d-n2c3k4-i13-f3" in c["id"] for c in data["cases"])
        assert "conform" in err  # the progress bar goes to stderr


def test_conform_failure_exits_nonzero(capsys, monkeypatch):
    from portconv.backends.aten import AtenRunner

    orig = AtenRunner.forward
    monkeypatch.setattr(AtenRunner, "forward", lambda self, *a: orig(self, *a) * 1.01)  # a 1% error
    from portconv.planner import clear_cache

    clear_cache()
    rc, out, _ = _run(capsys, "conform", "--backend", "aten", "--filter", "model-dcgan-d", "--no-gradcheck", "-q")
    assert rc == cli.EXIT_FAIL
    assert "FAILURES (2)" in out and "FAIL:" in out and "repro: portconv conv" in out


def test_errors_exit_nonzero(capsys, monkeypatch):
    rc, _, err = _run(capsys, "conform", "--backend", "nosuch", "-q")
    assert rc == cli.EXIT_USAGE and "unknown portconv backend 'nosuch'" in err
    rc, _, err = _run(capsys, "conv", *SMALL, "--backend", "nosuch")
    assert rc == cli.EXIT_USAGE and "nosuch" in err
    from portconv.backends.aten import AtenBackend
    from portconv.device import Availability

    monkeypatch.setattr(AtenBackend, "probe", lambda self: Availability.no("switched off for this test"))
    from portconv.planner import clear_cache

    clear_cache()
    rc, _, err = _run(capsys, "conform", "--backend", "aten", "--filter", "model-dcgan", "-q")
    assert rc == cli.EXIT_UNAVAILABLE and "switched off for this test" in err
    rc, _, err = _run(capsys, "conv", *SMALL, "--backend", "aten")
    assert rc == cli.EXIT_UNAVAILABLE and "switched off for this test" in err
    for command in ("explain", "bench"):  # before any tensor is made or anything is timed, as the help says
        rc, out, err = _run(capsys, command, *SMALL, "--backend", "aten")
        assert rc == cli.EXIT_UNAVAILABLE and "backend 'aten' is unavailable: switched off for this test" in err
        assert "Traceback" not in err
    clear_cache()
    rc, _, _ = _run(capsys, "conform", "--filter", "no-such-case-id")
    assert rc == cli.EXIT_USAGE
    assert cli.main(["conv", "--dtype", "int7"]) == cli.EXIT_USAGE


def test_subprocess_devices_conv_conform():
    p = _sub("devices")
    assert p.returncode == 0 and "aten     available" in p.stdout and "PORTCONV_POISON" in p.stdout
    p = _sub("conv", *SMALL, "--backend", "aten", "--verify")
    assert p.returncode == 0 and "PASS" in p.stdout, p.stdout + p.stderr
    p = _sub("conform", "--backend", "aten", "--filter", "model-wav2vec2-fe0", "--no-gradcheck")
    assert p.returncode == 0 and "PASS:" in p.stdout, p.stdout + p.stderr
    p = _sub("conform", "--backend", "nosuch")
    assert p.returncode != 0 and "nosuch" in p.stderr


def test_time_reports_the_run_time_compiles(monkeypatch):
    """`portconv conv --time` lists the NVRTC/hiprtc compiles (or disk reads) the first calls made."""
    import portconv.backends.simt.compile as cp
    from portconv.cli import _compile_report

    monkeypatch.setattr(cp, "_events", [cp.CompileEvent("direct.cu", (("PC_DTYPE", "0"),), "sm_90", "nvrtc", 0.5, 0),
                                        cp.CompileEvent("depthwise.cu", (), "sm_90", "disk", 0.01, 0)])
    text = _compile_report()
    assert "direct.cu" in text and "nvrtc" in text and "500.0 ms" in text and "disk" in text
    assert "2 module(s), 510.0 ms in all" in text
    monkeypatch.setattr(cp, "_events", [])
    assert "no run-time compile recorded" in _compile_report()
