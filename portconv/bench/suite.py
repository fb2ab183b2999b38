"""Benchmark workloads: suite.json rows or one shape from MIOpenDriver's flags, filtered, batch-scaled, dtype-set."""
from __future__ import annotations

import dataclasses
import fnmatch
import json
import pathlib

from ..conformance.cases import Case

DIRECTIONS = ("fwd", "bwd-data", "bwd-weight")
MASKS = {"bwd-data": (True, False, False), "bwd-weight": (False, True, False)}
_DIRECTION_ALIASES = {"fwd": "fwd", "forward": "fwd", "bwd-data": "bwd-data", "bwd": "bwd-data", "bd": "bwd-data",
                      "backward-data": "bwd-data", "bwd-weight": "bwd-weight", "wrw": "bwd-weight",
                      "bw": "bwd-weight", "backward-weight": "bwd-weight"}
_LAYOUTS = {"nchw": "contig", "ncw": "contig", "ncdhw": "contig", "contiguous": "contig", "contig": "contig",
            "channels_last": "chlast", "channels_last_3d": "chlast", "nhwc": "chlast", "ndhwc": "chlast",
            "nwc": "chlast", "chlast": "chlast", "strided": "strided"}
_DTYPES = ("float32", "float64", "float16", "bfloat16")
_FIELDS = ("name", "n", "c", "k", "spatial", "kernel", "stride", "padding", "dilation", "groups", "transposed",
           "output_padding", "dtype", "layout")
PACKAGED = pathlib.Path(__file__).with_name("suite.json")


@dataclasses.dataclass(frozen=True)
class Row:
    """One workload: a conformance Case (shapes, parameters, layout, bias) and the dtype it runs in."""

    name: str
    case: Case
    dtype: str
    batch_original: int
    source: str = "suite"  # 'suite' or 'flags'

    def describe(self) -> str:
        c = self.case
        t = "t" if c.transposed else ""
        pad = c.padding if isinstance(c.padding, str) else "x".join(map(str, c.padding))
        batch = f"n{c.n}" + (f" (suite n{self.batch_original})" if c.n != self.batch_original else "")
        return (f"{t}conv{c.rank}d {batch} c{c.c} k{c.k} {'x'.join(map(str, c.spatial))} "
                f"f{'x'.join(map(str, c.kernel))} s{'x'.join(map(str, c.stride))} p{pad} "
                f"d{'x'.join(map(str, c.dilation))} g{c.groups} {self.dtype} {c.layout}"
                + (" +bias" if c.bias else ""))

    def as_dict(self) -> dict:
        c = self.case
        return {"name": self.name, "source": self.source, "describe": self.describe(), "dtype": self.dtype,
                "layout": c.layout, "n": c.n, "n_original": self.batch_original, "c": c.c, "k": c.k,
                "spatial": list(c.spatial), "kernel": list(c.kernel), "stride": list(c.stride),
                "padding": c.padding if isinstance(c.padding, str) else list(c.padding),
                "dilation": list(c.dilation), "groups": c.groups, "transposed": c.transposed,
                "output_padding": list(c.output_padding), "bias": c.bias,
                "input_shape": list(c.input_shape), "weight_shape": list(c.weight_shape),
                "output_shape": list(c.output_shape), "reproduce": "portconv bench " + " ".join(self.cli_args())}

    def cli_args(self) -> list[str]:
        """`portconv bench` flags that time exactly this row as a single shape."""
        return self.case.cli_args(mask=False) + ["--dtype", self.dtype]  # Case adds --layout when not contig


def _row(r: dict, where: str) -> Row:
    missing = [f for f in _FIELDS if f not in r]
    if missing:
        raise ValueError(f"{where}: suite row {r.get('name', '?')!r} lacks {', '.join(missing)}")
    rank = len(r["spatial"])
    if not 1 <= rank <= 3:
        raise ValueError(f"{where}: row {r['name']!r} has {rank} spatial dims (1 to 3 are supported)")
    layout = _LAYOUTS.get(str(r["layout"]).lower())
    if layout is None:
        raise ValueError(f"{where}: row {r['name']!r} has unknown layout {r['layout']!r}")
    if r["dtype"] not in _DTYPES:
        raise ValueError(f"{where}: row {r['name']!r} has unknown dtype {r['dtype']!r}")
    pad = r["padding"] if isinstance(r["padding"], str) else tuple(r["padding"])
    case = Case(rank=rank, n=int(r["n"]), c=int(r["c"]), k=int(r["k"]), spatial=tuple(r["spatial"]),
                kernel=tuple(r["kernel"]), stride=tuple(r["stride"]), padding=pad, dilation=tuple(r["dilation"]),
                groups=int(r["groups"]), transposed=bool(r["transposed"]),
                output_padding=tuple(r["output_padding"]), bias=bool(r.get("bias", False)), layout=layout,
                name=r["name"], family="bench")
    if not case.valid():
        raise ValueError(f"{where}: row {r['name']!r} is not a valid convolution: {'; '.join(case.problems())}")
    return Row(r["name"], case, r["dtype"], case.n, "suite")


def load_suite(path: str | pathlib.Path | None = None) -> tuple[list[Row], str]:
    """(rows, the path read). ``path`` None: the suite shipped with the package (portconv/bench/suite.json)."""
    p = pathlib.Path(path) if path is not None else PACKAGED
    try:
        data = json.loads(p.read_text())
    except FileNotFoundError:
        raise ValueError(f"suite file {str(p)!r} does not exist") from None
    except json.JSONDecodeError as e:
        raise ValueError(f"suite file {str(p)!r} is not valid JSON: {e}") from None
    rows = [_row(r, str(p)) for r in data.get("rows", [])]
    names = [r.name for r in rows]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise ValueError(f"{p}: duplicate row names {', '.join(dup)}")
    return rows, str(p)


def row_from_case(case: Case, dtype: str) -> Row:
    case = dataclasses.replace(case, name="", family="bench")
    name = case.key.rsplit("-m", 1)[0]  # the geometry key without the mask and layout suffix
    return Row(name, case, dtype, case.n, "flags")


def select(rows: list[Row], patterns: str | None) -> list[Row]:
    """Rows whose names match any comma-separated name or glob; every pattern must match something."""
    if not patterns:
        return list(rows)
    pats = [p.strip() for p in patterns.split(",") if p.strip()]
    for p in pats:
        if not any(fnmatch.fnmatchcase(r.name, p) for r in rows):
            raise ValueError(f"--rows: {p!r} matches no row; rows: {', '.join(r.name for r in rows)}")
    return [r for r in rows if any(fnmatch.fnmatchcase(r.name, p) for p in pats)]


def adjust(rows: list[Row], scale_batch: int | None = None, dtype: str | None = None,
           layout: str | None = None) -> list[Row]:
    """Cap every row's batch at ``scale_batch``, and override its dtype and layout when given."""
    out = []
    for r in rows:
        case = r.case
        if scale_batch is not None:
            if scale_batch < 1:
                raise ValueError("--scale-batch must be at least 1")
            case = dataclasses.replace(case, n=min(case.n, scale_batch))
        if layout is not None:
            case = dataclasses.replace(case, layout=_LAYOUTS[layout])
        out.append(dataclasses.replace(r, case=case, dtype=dtype or r.dtype))
    return out


def parse_directions(text: str | None) -> tuple[str, ...]:
    """'fwd,bwd-data' -> ('fwd', 'bwd-data') in canonical order; None or 'all' -> all three."""
    if not text or text.strip().lower() == "all":
        return DIRECTIONS
    got = set()
    for part in text.split(","):
        name = _DIRECTION_ALIASES.get(part.strip().lower())
        if name is None:
            raise ValueError(f"unknown direction {part.strip()!r} (fwd, bwd-data, bwd-weight, all)")
        got.add(name)
    return tuple(d for d in DIRECTIONS if d in got)
