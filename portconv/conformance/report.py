"""The conformance report: progress bar, summary counts, terminal table and the JSON file (device, versions, cases)."""
from __future__ import annotations

import collections
import dataclasses
import datetime
import json
import os
import platform
import sys
import time

from ..knobs import raw
from .tolerance import json_float

TENSOR_NAMES = ("forward", "grad_input", "grad_weight", "grad_bias")


class Progress:
    """A one-line progress bar on stderr (redrawn on a terminal, a line per 10% otherwise). No dependencies."""

    def __init__(self, total: int, enabled: bool = True, title: str = "", stream=None, width: int = 28):
        self.total, self.enabled, self.title, self.width = max(total, 1), enabled, title, width
        self.stream = stream or sys.stderr
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self.done = self.failed = 0
        self.t0 = time.perf_counter()
        self._last_draw = 0.0
        self._last_decile = -1

    def update(self, label: str = "", failed: bool = False) -> None:
        self.done += 1
        self.failed += bool(failed)
        if not self.enabled:
            return
        now = time.perf_counter()
        frac = self.done / self.total
        fails = f" {self.failed} FAILED" if self.failed else ""
        if self.tty:
            if now - self._last_draw < 0.08 and self.done < self.total:
                return
            self._last_draw = now
            fill = int(frac * self.width)
            bar = "#" * fill + "-" * (self.width - fill)
            line = (f"\r{self.title} [{bar}] {self.done}/{self.total} {frac:4.0%} {now - self.t0:6.1f}s{fails}  "
                    f"{label[:48]}")
            cols = _columns()
            self.stream.write(line[:cols].ljust(min(cols, 160)))
            self.stream.flush()
        else:
            decile = int(frac * 10)
            if decile != self._last_decile:
                self._last_decile = decile
                self.stream.write(f"{self.title}: {self.done}/{self.total} ({frac:.0%}) {now - self.t0:.1f}s{fails}\n")
                self.stream.flush()

    def close(self) -> None:
        if self.enabled and self.tty:
            self.stream.write("\n")
            self.stream.flush()


def _columns() -> int:
    try:
        return os.get_terminal_size(sys.stderr.fileno()).columns - 1
    except OSError:
        return 120


def versions() -> dict[str, str]:
    """Versions of Python, torch, numpy, portconv and of the vendor modules that this process has imported."""
    import numpy
    import torch

    from .. import __version__

    out = {"python": platform.python_version(), "platform": platform.platform(), "portconv": __version__,
           "torch": torch.__version__, "numpy": numpy.__version__}
    if torch.version.cuda:
        out["torch_cuda"] = torch.version.cuda
    if getattr(torch.version, "hip", None):
        out["torch_hip"] = torch.version.hip
    for mod in ("pyopencl", "cupy"):
        m = sys.modules.get(mod)
        if m is not None:
            out[mod] = str(getattr(m, "VERSION_TEXT", None) or getattr(m, "__version__", "?"))
    return out


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


@dataclasses.dataclass
class Report:
    backend: str
    dtypes: list[str]
    probe: str = ""
    tensor_device: str = "cpu"
    started: str = dataclasses.field(default_factory=_now)
    finished: str = ""
    duration_s: float = 0.0
    results: list = dataclasses.field(default_factory=list)  # CaseResult, conformance and gradcheck
    knobs: dict = dataclasses.field(default_factory=dict)
    devices: list[dict] = dataclasses.field(default_factory=list)
    versions: dict = dataclasses.field(default_factory=dict)

    # --- collecting ---------------------------------------------------------------------------------
    def add(self, result) -> None:
        self.results.append(result)
        info = getattr(result, "device_info", None)
        if info is not None:
            d = info.as_dict()
            if d not in self.devices:
                self.devices.append(d)

    def record_knobs(self) -> None:
        self.knobs = raw()

    def finish(self, duration_s: float) -> None:
        self.finished = _now()
        self.duration_s = duration_s
        self.versions = versions()

    # --- views ---------------------------------------------------------------------------------------
    @property
    def cases(self) -> list:
        return [r for r in self.results if r.kind == "conformance"]

    @property
    def gradchecks(self) -> list:
        return [r for r in self.results if r.kind == "gradcheck"]

    def failures(self) -> list:
        return [r for r in self.results if r.status == "fail"]

    def unsupported(self) -> list:
        return [r for r in self.results if r.status == "unsupported"]

    @property
    def ok(self) -> bool:
        return not self.failures()

    def summary(self) -> dict:
        per_dtype: dict = {}
        for dt in self.dtypes:
            rs = [r for r in self.cases if r.dtype == dt]
            c = collections.Counter(r.status for r in rs)
            tensors = {}
            for name in TENSOR_NAMES:
                checks = [r.tensors[name] for r in rs if name in r.tensors]
                tc = collections.Counter(t.status for t in checks)
                measured = [t for t in checks if t.status in ("pass", "fail") and t.elements]
                tensors[name] = {"pass": tc["pass"], "fail": tc["fail"], "not_requested": tc["n/a"],
                                 "max_ratio": max((t.max_ratio for t in measured), default=0.0),
                                 "max_abs": max((t.max_abs for t in measured), default=0.0),
                                 "max_rel": max((t.max_rel for t in measured), default=0.0)}
            per_dtype[dt] = {"cases": len(rs), "pass": c["pass"], "fail": c["fail"], "unsupported": c["unsupported"],
                             "time_s": sum(r.time_s for r in rs), "tensors": tensors}
        g = collections.Counter(r.status for r in self.gradchecks)
        allc = collections.Counter(r.status for r in self.results)
        return {"dtypes": per_dtype, "gradcheck": {"cases": len(self.gradchecks), "pass": g["pass"],
                                                   "fail": g["fail"], "unsupported": g["unsupported"]},
                "total": {"pass": allc["pass"], "fail": allc["fail"], "unsupported": allc["unsupported"]}}

    # --- output --------------------------------------------------------------------------------------
    def table(self, max_failures: int = 25) -> str:
        s = self.summary()
        ncases = len({r.case.key for r in self.cases})
        families = collections.Counter(r.case.family == "curated" for r in self.cases if r.dtype == self.dtypes[0])
        lines = [f"portconv conformance: backend {self.backend}, torch tensors on {self.tensor_device}",
                 f"backend: {self.probe}"]
        for d in self.devices:
            vers = ", ".join(f"{k} {v}" for k, v in d.get("versions", {}).items())
            lines.append(f"device:  {d['name']} [{d['vendor']} {d['kind']} {d['arch']}] ({vers})")
        lines.append(f"cases:   {ncases} ({families[False]} grid + {families[True]} curated) x "
                     f"{len(self.dtypes)} dtype(s); gradcheck {len(self.gradchecks)}; {self.duration_s:.1f}s")
        lines += ["", f"{'dtype':<10}{'cases':>7}{'pass':>7}{'fail':>7}{'unsup':>7}{'in calls':>10}"]
        for dt, d in s["dtypes"].items():
            lines.append(f"{dt:<10}{d['cases']:>7}{d['pass']:>7}{d['fail']:>7}{d['unsupported']:>7}"
                         f"{d['time_s']:>9.1f}s")
        lines += ["", f"{'tensor':<13}{'dtype':<10}{'pass':>7}{'fail':>7}{'n/a':>6}{'worst err/tol':>15}"
                      f"{'max |err|':>12}{'max err/absref':>16}"]
        for dt, d in s["dtypes"].items():
            for name, t in d["tensors"].items():
                lines.append(f"{name:<13}{dt:<10}{t['pass']:>7}{t['fail']:>7}{t['not_requested']:>6}"
                             f"{t['max_ratio']:>15.3g}{t['max_abs']:>12.3g}{t['max_rel']:>16.3g}")
        g = s["gradcheck"]
        if g["cases"]:
            lines += ["", f"gradcheck (float64, portconv autograd): {g['pass']} passed, {g['fail']} failed, "
                          f"{g['unsupported']} unsupported of {g['cases']}"]
        fails = self.failures()
        if fails:
            lines += ["", f"FAILURES ({len(fails)}):"]
            for r in fails[:max_failures]:
                lines.append(f"  {r.dtype:<9} {r.id}  [{r.case.describe()}]")
                lines += [f"      {m}" for m in r.errors()[:4]]
                lines.append(f"      repro: portconv conv {' '.join(r.case.cli_args())} --backend {self.backend} "
                             f"--dtype {r.dtype} --verify")
            if len(fails) > max_failures:
                lines.append(f"  ... and {len(fails) - max_failures} more (every one is in the JSON report)")
        unsup = self.unsupported()
        if unsup:
            reasons = collections.Counter((r.dtype, r.reason) for r in unsup)
            lines += ["", f"UNSUPPORTED ({len(unsup)}; the plan's reasons):"]
            for (dt, why), n in reasons.most_common(10):
                lines.append(f"  {n:>5} x {dt:<9} {why.splitlines()[0][:150]}")
        t = s["total"]
        verdict = "PASS" if self.ok else "FAIL"
        lines += ["", f"{verdict}: {t['pass']} passed, {t['fail']} failed, {t['unsupported']} unsupported "
                      f"(backend {self.backend}, {', '.join(self.dtypes)})"]
        return "\n".join(lines)

    def as_dict(self) -> dict:
        summary = self.summary()
        for d in summary["dtypes"].values():
            for t in d["tensors"].values():
                for k in ("max_ratio", "max_abs", "max_rel"):
                    t[k] = json_float(t[k])
        return {"backend": self.backend, "probe": self.probe, "tensor_device": self.tensor_device,
                "dtypes": self.dtypes, "started": self.started, "finished": self.finished,
                "duration_s": round(self.duration_s, 3), "devices": self.devices, "versions": self.versions,
                "knobs": self.knobs, "tolerance": _tolerance_doc(), "summary": summary, "ok": self.ok,
                "cases": [r.as_dict() for r in self.results]}

    def write_json(self, path: str) -> None:
        d = os.path.dirname(os.path.abspath(path))
        os.makedirs(d, exist_ok=True)
        d = self.as_dict()
        cases = d.pop("cases")
        head = json.dumps(d, indent=1, allow_nan=False)
        body = ",\n".join("  " + json.dumps(c, separators=(",", ":"), allow_nan=False) for c in cases)
        with open(path, "w") as f:  # strict JSON; one line per case, so reports diff well under git
            f.write(f'{head[:-2]},\n "cases": [\n{body}\n ]\n}}\n')


def _tolerance_doc() -> dict:
    from . import tolerance

    return {"formula": "|out-ref| <= eps_out*(|ref|+|partial|) + (C_ACC*eps_acc*sqrt(L) + 2*eps_in)*absref + tiny",
            "C_ACC": tolerance.C_ACC, "unit_roundoff": tolerance.UNIT_ROUNDOFF,
            "math_modes": {k: list(v) for k, v in tolerance.ACCUMULATION.items()}}
