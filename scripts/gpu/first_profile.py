"""Where a first training step's time goes: one side of one model, in this (fresh) process, its first step under
cProfile (cumulative and own time), then its second. Run it twice with the same empty PORTCONV_CACHE_DIR (and
CUDA_CACHE_PATH) for the cold and the warm first step (Note [first step cold and warm]); PyTorch's side beside it.
Public APIs only (portconv.convert, cProfile).

  PORTCONV_CACHE_DIR=/tmp/c python3 scripts/gpu/first_profile.py auto mobilenet_v2 float32   # cold, then again: warm
"""
from __future__ import annotations

import time

T0 = time.perf_counter()

import cProfile  # noqa: E402
import io  # noqa: E402
import pathlib  # noqa: E402
import pstats  # noqa: E402
import sys  # noqa: E402

import torch  # noqa: E402

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))  # portconv from this checkout

import portconv  # noqa: E402
from portconv.bench import models  # noqa: E402


def main(side: str, name: str, dtype: str, lines: int = 40) -> None:
    imported = time.perf_counter() - T0
    spec = models.resolve(name)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    torch.manual_seed(0)
    with models.precision(True, device):
        model = spec.build().to(device)
        x = torch.rand(spec.batch, *spec.sample, device=device)
        y = torch.randint(0, spec.classes, (spec.batch,), device=device) if spec.classes else x
        if side != "torch":
            model = portconv.convert(model, None if side == "auto" else side)
        opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
        step = models.make_step(model, opt, [(x, y)], spec, dtype, device, [])
        sync()
        prof = cProfile.Profile()
        t1 = time.perf_counter()
        prof.enable()
        step(None)
        sync()
        prof.disable()
        t2 = time.perf_counter()
        step(None)
        sync()
        t3 = time.perf_counter()
    print(f"FIRST {side} {name} {dtype}: imports {imported:.2f} s, first step {t2 - t1:.3f} s, second {t3 - t2:.3f} s")
    for key in ("cumulative", "tottime"):
        out = io.StringIO()
        pstats.Stats(prof, stream=out).sort_stats(key).print_stats(lines)
        print("\n".join(out.getvalue().splitlines()[4:lines + 10]))


if __name__ == "__main__":
    main(*sys.argv[1:4])
