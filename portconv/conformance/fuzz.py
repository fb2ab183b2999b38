"""portconv's fuzzer: random valid problems in random layouts, each run on a backend against PyTorch in float64."""
from __future__ import annotations

import dataclasses
import random
import time
from collections.abc import Sequence

from .cases import MASKS, Case

# Note [fuzzer]
# Differential testing beyond the grid: random_case draws a valid problem (rank 1-3, convolution or transposed,
# groups incl. depthwise with a multiplier, per-dim kernel, stride, padding incl. 'same'/'valid', dilation,
# output_padding), a batch, bias, output_mask and a layout among FUZZ_LAYOUTS ('expanded': stride-0 batch and
# output-channel axes, as expand() makes), and run_case checks forward and every requested gradient against
# PyTorch in float64 with the suite's tolerances and poisoned outputs, exactly as a grid case. A seed fixes the
# sequence, so a failure is reproduced by (seed, index) and reported with the case's key. CI runs a fixed-seed
# budget on PoCL (tests/test_fuzz.py); `portconv conform --fuzz N --seed S --backend B` runs any budget elsewhere.
FUZZ_LAYOUTS = ("contig", "chlast", "strided", "expanded")
_SPATIAL_MAX = {1: 24, 2: 11, 3: 6}


def random_case(rng: random.Random) -> Case:
    """A valid problem drawn from ``rng`` (Note [fuzzer])."""
    while True:
        rank = rng.choice((1, 2, 2, 3))
        transposed = rng.random() < 0.25
        groups = rng.choice((1, 1, 1, 2, 3, 4))
        c = groups * rng.choice((1, 1, 2, 3))
        k = groups * rng.choice((1, 2, 3))
        spatial = tuple(rng.randint(1, _SPATIAL_MAX[rank]) for _ in range(rank))
        kernel = tuple(rng.randint(1, 5 if rank < 3 else 3) for _ in range(rank))
        stride = tuple(rng.choice((1, 1, 2, 3)) for _ in range(rank))
        dilation = tuple(rng.choice((1, 1, 2)) for _ in range(rank))
        roll = rng.random()
        if roll < 0.1 and not transposed and set(stride) == {1}:
            padding: tuple[int, ...] | str = "same"
        elif roll < 0.15 and not transposed:
            padding = "valid"
        else:
            padding = tuple(rng.randint(0, 2) for _ in range(rank))
        output_padding = (tuple(rng.randint(0, max(s, d) - 1) for s, d in zip(stride, dilation)) if transposed
                          else (0,) * rank)
        case = Case(rank=rank, n=rng.choice((1, 2, 3)), c=c, k=k, spatial=spatial, kernel=kernel, stride=stride,
                    padding=padding, dilation=dilation, groups=groups, transposed=transposed,
                    output_padding=output_padding, bias=rng.random() < 0.6, mask=rng.choice(MASKS),
                    layout=rng.choice(FUZZ_LAYOUTS), family="fuzz")
        if case.valid():
            return case


@dataclasses.dataclass
class FuzzReport:
    backend: str
    seed: int
    rows: list[dict]
    seconds: float

    def count(self, status: str) -> int:
        return sum(r["status"] == status for r in self.rows)

    @property
    def failures(self) -> list[dict]:
        return [r for r in self.rows if r["status"] == "fail"]

    def __str__(self) -> str:
        lines = [f"fuzz {self.backend} seed {self.seed}: {len(self.rows)} runs, {self.count('pass')} passed, "
                 f"{self.count('fail')} failed, {self.count('unsupported')} unsupported, {self.seconds:.0f} s"]
        lines += [f"  FAIL #{r['index']} {r['case']} {r['dtype']}: {r['reason'][:300]}" for r in self.failures]
        return "\n".join(lines)


def fuzz(backend: str, count: int, seed: int = 0, dtypes: Sequence[str] = ("float32", "float64"),
         device=None, seconds: float | None = None) -> FuzzReport:
    """``count`` random cases (Note [fuzzer]) on ``backend``, each in one of ``dtypes`` (drawn), stopping early
    after ``seconds`` when given."""
    from .runner import run_case

    rng = random.Random(seed)
    rows = []
    t0 = time.perf_counter()
    for i in range(count):
        case, dtype = random_case(rng), rng.choice(tuple(dtypes))
        r = run_case(case, backend, dtype, device, warm=False)
        rows.append({"index": i, "case": case.id, "dtype": dtype, "status": r.status, "reason": r.reason or ""})
        if seconds is not None and time.perf_counter() - t0 > seconds:
            break
    return FuzzReport(backend, seed, rows, time.perf_counter() - t0)
