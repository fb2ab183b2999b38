"""The `portconv` command line: devices, conv (one problem, MIOpenDriver's flags), explain, conform."""
from __future__ import annotations

import argparse
import importlib.metadata
import json
import statistics
import sys
import time

from .driverflags import _directions, _dtype, _mask, add_problem_flags, case_from_args

EXIT_OK, EXIT_FAIL, EXIT_USAGE, EXIT_UNAVAILABLE = 0, 1, 2, 3
def _device(a):
    """The torch device of the problem's tensors; exit 3 (with the reason) where the requested backend or the
    device is unavailable here, before any tensor is made, and 2 for a name that is not a backend or device."""
    import torch

    from . import backends
    from .conformance.runner import default_device

    try:
        why = backends.unavailable(a.backend) if a.backend and a.backend != "auto" else ""
        if why:
            print(f"portconv: {why}", file=sys.stderr)
            raise SystemExit(EXIT_UNAVAILABLE)
        device = torch.device(a.device) if a.device else default_device(a.backend)
    except (ValueError, RuntimeError) as e:  # an unknown backend or device name
        print(f"portconv: {e}", file=sys.stderr)
        raise SystemExit(EXIT_USAGE) from None
    if device.type == "cuda" and not torch.cuda.is_available():
        print(f"portconv: device {device} is unavailable: this torch ({torch.__version__}) sees no CUDA/ROCm GPU",
              file=sys.stderr)
        raise SystemExit(EXIT_UNAVAILABLE)
    return device


def _plan_or_exit(case, inputs, backend):
    from .conformance.runner import plan_for
    from .errors import BackendUnavailable, ConvError, Unsupported

    try:
        return plan_for(case, inputs, backend)
    except (BackendUnavailable, Unsupported, ConvError, ValueError) as e:
        print(f"portconv: {e}", file=sys.stderr)
        raise SystemExit(EXIT_UNAVAILABLE if not isinstance(e, (ConvError, ValueError)) else EXIT_USAGE) from None


def _indent(text: str, pad: str = "  ") -> str:
    return "\n".join(pad + line for line in text.splitlines())


# --- portconv devices --------------------------------------------------------------------------------------------
def cmd_devices(a) -> int:
    from . import backends
    from .knobs import KNOBS, options, raw

    rows = []
    for bid in backends.all_ids():
        impl = backends.get(bid)
        try:
            avail = impl.probe()
            ok, why = avail.ok, avail.reason
        except Exception as e:  # noqa: BLE001 - a probe must not raise; if it does, that is what we show
            ok, why = False, f"probe raised {type(e).__name__}: {e}"
        devs, dev_err = [], ""
        if ok:
            try:
                devs = [d.as_dict() for d in impl.devices()]
            except Exception as e:  # noqa: BLE001 - shown in the listing
                dev_err = f"devices() raised {type(e).__name__}: {e}"
        rows.append({"backend": str(bid), "available": ok, "reason": why, "devices": devs, "error": dev_err})
    knobs = raw()
    vers = {}
    for dist in ("torch", "numpy", "pyopencl", "pocl-binary-distribution", "cupy-cuda12x", "cupy-cuda13x",
                 "cupy-rocm-7-0", "nvidia-cuda-nvrtc", "nvidia-cuda-nvrtc-cu12"):
        try:
            vers[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            continue
    from . import native

    if a.json:
        print(json.dumps({"backends": rows, "knobs": knobs, "installed": vers, "native": native.status()}, indent=1))
        return EXIT_OK
    print("backends:")
    for r in rows:
        print(f"  {r['backend']:<8} {'available' if r['available'] else 'unavailable':<12} {r['reason']}")
        for i, d in enumerate(r["devices"]):
            v = ", ".join(f"{k} {x}" for k, x in d["versions"].items())
            print(f"      [{i}] {d['name']} [{d['vendor']} {d['kind']} {d['arch']}] {d['index']} "
                  f"fp64={'yes' if d['fp64'] else 'no'} fp16={'yes' if d['fp16'] else 'no'} ({v})")
        if r["error"]:
            print(f"      {r['error']}")
    print(f"native executor (Note [native executor]; the cuda and hip kernels on NVIDIA): {native.status()}")
    from .backends.miopen import miopen_settings

    print("MIOpen settings (read by MIOpen on ROCm builds of PyTorch; see docs/kernels/hip.md):")
    for name, value, meaning in miopen_settings():
        print(f"  {name:<32} {value:<10} {meaning}")
    print("knobs (read once, at first use: Note [knobs]):")
    for k in KNOBS:
        print(f"  {k.name:<24} {knobs[k.name] if knobs[k.name] is not None else '(unset)':<10} {k.help}")
    if options().describe():
        print(f"options: {options().describe()}")
    print("installed: " + ", ".join(f"{k} {v}" for k, v in vers.items()))
    return EXIT_OK


# --- portconv conv ----------------------------------------------------------------------------------------------
def _timed(fn, sync) -> tuple[object, float]:
    """(result, milliseconds) of one call, wall clock, with a device sync."""
    t0 = time.perf_counter()
    out = fn()
    sync()
    return out, (time.perf_counter() - t0) * 1e3


def _tensor_expr(shape, layout: str, dtype: str) -> str:
    """Python that makes a random tensor of ``shape`` in one of the conformance layouts."""
    def randn(dims):
        return f"torch.randn({', '.join(map(str, dims))}, dtype=torch.{dtype})"

    if layout == "chlast" and len(shape) in (4, 5):
        return f"{randn(shape)}.to(memory_format=torch.{'channels_last' if len(shape) == 4 else 'channels_last_3d'})"
    if layout == "chlast" and len(shape) == 3:
        return f"{randn((shape[0], shape[2], shape[1]))}.transpose(1, 2)"
    if layout == "strided" and len(shape) >= 3:
        return f"{randn((shape[1], shape[0], *shape[2:-1], 2 * shape[-1] + 1))}.transpose(0, 1)[..., 1::2]"
    if layout == "strided":
        return f"{randn((2 * shape[0] + 1,))}[1::2]"
    return randn(shape)


def _python_snippet(case, dtype: str, backend: str | None) -> str:
    a = case.conv_args()
    bk = f", backend={backend!r}" if backend else ""
    lines = ["import torch, portconv", "torch.manual_seed(0)",
             f"x = {_tensor_expr(case.input_shape, case.layout, dtype)}",
             f"w = {_tensor_expr(case.weight_shape, case.layout, dtype)}",
             f"b = {_tensor_expr((case.k,), case.layout, dtype)}" if case.bias else "b = None"]
    lines.append(f"y = portconv.convolution(x, w, b, stride={a['stride']}, padding={a['padding']!r}, "
                 f"dilation={a['dilation']}, transposed={a['transposed']}, output_padding={a['output_padding']}, "
                 f"groups={a['groups']}{bk})")
    lines.append(f"gi, gw, gb = portconv.convolution_backward(torch.randn_like(y), x, w, [{case.k}], {a['stride']}, "
                 f"{a['padding']!r}, {a['dilation']}, {a['transposed']}, {a['output_padding']}, {a['groups']}, "
                 f"{tuple(case.mask)}{bk})")
    return "\n".join(lines)


def cmd_conv(a) -> int:
    import torch

    from . import functional
    from .conformance.reference import make_inputs, output_shape, reference
    from .conformance.tolerance import check

    dirs = 7 if a.mask else a.forw
    steps = [("forward", None)] if dirs & 1 or a.mask else []
    if a.mask:
        steps.append(("backward", a.mask))
    else:
        if dirs & 2:
            steps.append(("bwd-data", (True, False, False)))
        if dirs & 4:
            steps.append(("bwd-weight", (False, True, bool(a.bias))))
    union = tuple(any(m[i] for _, m in steps if m) for i in range(3))
    case = case_from_args(a, union if any(union) else (True, False, False))
    if not case.valid():
        print(f"portconv: invalid problem: {'; '.join(case.problems())}", file=sys.stderr)
        return EXIT_USAGE
    device = _device(a)
    inputs = make_inputs(case, a.dtype, device, output_shape(case))
    plan = _plan_or_exit(case, inputs, a.backend)
    results = (("output",) if steps and steps[0][0] == "forward" else ()) + tuple(
        r for r, on in zip(("grad_input", "grad_weight", "grad_bias"), union) if on)
    print(f"problem: {case.describe()}\nplan:\n{_indent(plan.explain(results=results))}")
    ref = reference(case, inputs) if a.verify else None
    lengths = case.reduction_lengths()
    args = case.conv_args()
    sync = (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else (lambda: None)
    status = EXIT_OK
    print(f"\n{'step':<12}{'tensor':<13}{'verify':<8}{'max |err|':>11}{'err/tol':>10}"
          + (f"{'first ms':>11}{f'median ms of {a.iter}':>18}" if a.time else ""))
    for step, mask in steps:
        if mask is None:
            def call():
                return functional.convolution(inputs.input, inputs.weight, inputs.bias, **args, backend=a.backend)
        else:
            def call(mask=mask):
                return functional.convolution_backward(
                    inputs.grad_output, inputs.input, inputs.weight, [case.k], args["stride"], args["padding"],
                    args["dilation"], args["transposed"], args["output_padding"], args["groups"], mask,
                    backend=a.backend)
        out, first = _timed(call, sync)  # the first call includes compiling and fetching kernels
        median = statistics.median(_timed(call, sync)[1] for _ in range(max(a.iter, 1))) if a.time else 0.0
        names = ["forward"] if mask is None else [n for n, m in zip(("grad_input", "grad_weight", "grad_bias"),
                                                                     mask) if m]
        outs = [out] if mask is None else [o for o, m in zip(out, mask) if m]
        for i, (name, o) in enumerate(zip(names, outs)):
            verdict, err, ratio = "-", "", ""
            if ref is not None:
                r = check(name, o, ref.value[name], ref.absolute[name], lengths[name], a.dtype, plan.math, device,
                          ref.partial.get(name))
                verdict, err, ratio = r.status.upper(), f"{r.max_abs:.3g}", f"{r.max_ratio:.3g}"
                if r.failed:
                    status = EXIT_FAIL
                    print(f"  {r.message}")
            times = (f"{first:>11.3f}{median:>18.3f}" if a.time and i == 0 else "")
            print(f"{step if i == 0 else '':<12}{name:<13}{verdict:<8}{err:>11}{ratio:>10}{times}")
    if a.time:
        print(_compile_report())
    backend = a.backend or str(plan.backend)
    flags = case.cli_args(mask=bool(a.mask)) + ([] if a.mask or a.forw == 7 else ["-F", str(a.forw)])
    print(f"\nreproduce:\n  portconv conv {' '.join(flags)} --backend {backend} --dtype {a.dtype} --verify"
          f"\n\n{_indent(_python_snippet(case, a.dtype, backend))}")
    return status


def _compile_report() -> str:
    """What the first calls spent making kernels ready: NVRTC/hiprtc compiles or disk-cache reads (cuda, hip)."""
    mod = sys.modules.get("portconv.backends.simt.compile")
    events = mod.compile_events() if mod is not None else []
    if not events:
        return ("\nkernel compile: no run-time compile recorded in this process (OpenCL programs come from "
                "pyopencl's cache or are built inside the 'first ms' above; aten/cudnn/miopen compile nothing)")
    lines = ["\nkernel compile (first call; 'disk' = read back from PORTCONV_CACHE_DIR; ms: what the launching thread "
             "waited,\n  a compile ahead on worker threads included, Note [compile ahead]):"]
    for e in events:
        defs = " ".join(f"-D{k}={v}" for k, v in e.defines)
        lines.append(f"  {e.entry:<16} {e.arch:<8} {e.how:<7} {e.seconds * 1e3:9.1f} ms  {defs}")
    total = sum(e.seconds for e in events)
    lines.append(f"  {len(events)} module(s), {total * 1e3:.1f} ms in all")
    return "\n".join(lines)


# --- portconv explain ------------------------------------------------------------------------------------------
def _aten_model(problem, device) -> str:
    """The ATen model's answer (portconv.rules), imported here so explain works before and after it lands."""
    try:
        from . import rules
    except ImportError as e:
        return f"(the ATen model portconv.rules is not available: {e})"
    try:
        ctx = rules.TorchContext.from_torch(device)
        backend, fmt = rules.aten_answer(problem, ctx)
    except Exception as e:  # noqa: BLE001 - shown to the user as the model's failure
        return f"(portconv.rules failed: {type(e).__name__}: {e})"
    return f"{backend}, memory format {fmt}"


def _torch_says(problem, inputs) -> str:
    import torch

    p = problem.params
    if any(p.padding_extra):
        return "(padding='same' with an even kernel: ATen pads the input first)"
    try:
        b = torch._C._select_conv_backend(inputs.input, inputs.weight, inputs.bias, list(p.stride), list(p.padding),
                                          list(p.dilation), p.transposed, list(p.output_padding), p.groups, None)
        f = torch._C._conv_determine_backend_memory_format(inputs.input, inputs.weight, b)
    except (RuntimeError, TypeError, AttributeError) as e:
        return f"(torch cannot say: {e})"
    return f"{str(b).split('.')[-1]}, memory format {str(f).replace('torch.', '')}"


def cmd_explain(a) -> int:
    from .conformance.reference import make_inputs, output_shape

    rows = [(None, case_from_args(a), a.dtype)] if not a.suite else _suite_cases(a.suite, a.row)
    device = _device(a)
    shown = set()  # devices already printed: a suite prints each once
    for name, case, dtype in rows:
        inputs = make_inputs(case, dtype, device, output_shape(case), fill=False)
        plan = _plan_or_exit(case, inputs, a.backend)
        if plan.device not in shown:
            shown.add(plan.device)
            print(f"device {plan.device.describe(versions=False)}\n  versions: {plan.device.describe_versions()}\n")
        if name:
            print(f"== {name}")
        print(f"portconv plan:\n{_indent(plan.explain(device=False))}")
        print(f"ATen model (portconv.rules): {_aten_model(plan.problem, device)}")
        print(f"torch on this machine:       {_torch_says(plan.problem, inputs)}\n")
    return EXIT_OK


def _suite_cases(path: str, row: str | None):
    """(name, case, dtype) for the rows of a bench suite file (portconv/bench/suite.json's format)."""
    from .conformance.cases import Case

    with open(path) as f:
        rows = json.load(f)["rows"]
    out = []
    for r in rows:
        if row and row not in r["name"]:
            continue
        c = Case(rank=len(r["spatial"]), n=r["n"], c=r["c"], k=r["k"], spatial=tuple(r["spatial"]),
                 kernel=tuple(r["kernel"]), stride=tuple(r["stride"]), padding=tuple(r["padding"]),
                 dilation=tuple(r["dilation"]), groups=r["groups"], transposed=r["transposed"],
                 output_padding=tuple(r["output_padding"]), bias=False,
                 layout="chlast" if "channels_last" in r["layout"] else "contig", name=r["name"], family="suite")
        out.append((r["name"], c, r["dtype"]))
    return out


# --- portconv conform ------------------------------------------------------------------------------------------
def _found_backends() -> list[str]:
    """Every available portconv backend but aten (PyTorch itself): the devices found. OpenCL is always tried."""
    from . import backends

    found = [str(b) for b in backends.all_ids() if b != backends.BackendId.ATEN and backends.get(b).probe()]
    return found or ["opencl"]  # nothing found: run opencl anyway, so its absence fails with the reason


def _conform_custom(a, selected) -> int:
    """portconv conform --custom module:function: check_forward of a user kernel (Note [custom forward])."""
    from .custom import check_forward, load

    try:
        fn = load(a.custom)
    except ValueError as e:
        print(f"portconv conform: {e}", file=sys.stderr)
        return EXIT_USAGE
    dtypes = [_dtype(d) for arg in (a.dtype or ["float32,float64"]) for d in arg.split(",")]
    report = check_forward(fn, cases=selected, dtypes=dtypes, device=a.device or "cpu")
    print(report)
    if a.json:
        with open(a.json, "w", encoding="utf-8") as f:
            json.dump({"kernel": report.name, "ok": report.ok, "rows": report.rows}, f, indent=1)
    return EXIT_OK if report.ok else EXIT_FAIL


def _conform_fuzz(a) -> int:
    """portconv conform --fuzz N: N random cases per backend (Note [fuzzer]); exit 1 on any failure."""
    from .conformance.fuzz import fuzz
    from .errors import BackendUnavailable

    dtypes = [_dtype(d) for arg in (a.dtype or ["float32,float64"]) for d in arg.split(",")]
    status = EXIT_OK
    for bk in a.backend or _found_backends():
        try:
            report = fuzz(bk, a.fuzz, seed=a.seed, dtypes=dtypes, device=a.device, seconds=a.seconds)
        except (ValueError, BackendUnavailable) as e:
            print(f"portconv conform: {e}", file=sys.stderr)
            status = max(status, EXIT_USAGE if isinstance(e, ValueError) else EXIT_UNAVAILABLE)
            continue
        print(report)
        if report.failures:
            status = max(status, EXIT_FAIL)
    return status


def _conform_long(a) -> int:
    """portconv conform --long-reductions: Note [long reductions] per own kernel set; exit 1 on any failure."""
    from .conformance import longred
    from .conformance.runner import default_device
    from .errors import BackendUnavailable

    status = EXIT_OK
    for bk in a.backend or [b for b in _found_backends() if b in ("opencl", "cuda", "hip")]:
        try:
            rows = longred.run(bk, a.device or default_device(bk))
        except (ValueError, BackendUnavailable) as e:
            print(f"portconv conform: {e}", file=sys.stderr)
            status = max(status, EXIT_USAGE if isinstance(e, ValueError) else EXIT_UNAVAILABLE)
            continue
        print(f"{bk}: long float32 reductions (Note [long reductions])")
        for r in rows:
            print("  " + r.line())
        if not all(r.ok for r in rows):
            status = max(status, EXIT_FAIL)
    return status


def cmd_conform(a) -> int:
    from .conformance import cases as _cases
    from .conformance.runner import run
    from .errors import BackendUnavailable

    selected = _cases.select(full=not a.subset, filters=a.filter or ())
    if a.custom:
        return _conform_custom(a, selected)
    if a.fuzz:
        return _conform_fuzz(a)
    if a.long_reductions:
        return _conform_long(a)
    if a.list:
        for c in selected:
            print(f"{c.id:<70} {c.describe()}")
        return EXIT_OK
    if not selected:
        print(f"portconv: no case matches {a.filter}", file=sys.stderr)
        return EXIT_USAGE
    dtypes = [d for arg in (a.dtype or ["float32,float64"]) for d in arg.split(",")]
    dtypes = [_dtype(d) for d in dtypes]
    status = EXIT_OK
    backends = a.backend or _found_backends()
    if not a.backend:
        print(f"portconv conform: backends found here: {', '.join(backends)} (choose with --backend)", file=sys.stderr)
    for bk in backends:
        path = a.json if len(backends) == 1 or not a.json else a.json.replace(".json", f".{bk}.json")
        try:
            report = run(bk, dtypes=dtypes, cases=selected, progress=not a.quiet, json_path=path, device=a.device,
                         gradcheck=not a.no_gradcheck)
        except ValueError as e:  # an unknown backend name
            print(f"portconv conform: {e}", file=sys.stderr)
            status = max(status, EXIT_USAGE)
            continue
        except BackendUnavailable as e:
            print(f"portconv conform: {e}", file=sys.stderr)
            status = max(status, EXIT_UNAVAILABLE)
            continue
        print(report.table())
        if path:
            print(f"JSON report: {path}")
        if not report.ok or (a.strict and report.unsupported()):
            status = max(status, EXIT_FAIL)
    return status


# --- the parser ---------------------------------------------------------------------------------------------------
def cmd_tune(a) -> int:
    """The tuning cache file (Note [tuning cache file]): where it is and how many entries, export, import."""
    from . import tuning

    if a.export:
        n = tuning.export_entries(a.export)
        print(f"exported {n} entries of {tuning.cache_path()} to {a.export}")
    if a.import_:
        try:
            took, total = tuning.import_entries(a.import_)
        except ValueError as e:
            print(f"portconv tune: {e}", file=sys.stderr)
            return EXIT_USAGE
        print(f"imported {took} entries from {a.import_}; {tuning.cache_path()} holds {total}")
    if not (a.export or a.import_):
        print(f"{tuning.cache_path()}: {len(tuning.load())} entries")
    return EXIT_OK


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="portconv", description="One convolution API across CUDA, HIP and OpenCL, "
                                "held to PyTorch's numbers.",
                                epilog="exit codes: 0 ok, 1 verification/conformance failure, 2 usage, "
                                       "3 backend unavailable or cannot run the problem")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    d = sub.add_parser("devices", help="every backend, available or not and why; devices; knobs")
    d.add_argument("--json", action="store_true", help="print JSON")
    d.set_defaults(func=cmd_devices)

    c = sub.add_parser("conv", help="run one problem (MIOpenDriver-style flags): plan, verify, time, reproducer")
    add_problem_flags(c)
    c.add_argument("-F", "--forw", type=_directions, default=7,
                   help="0 all (default), 1 fwd, 2 bwd-data, 4 bwd-weight, or sums; or names: fwd,bwd-data,...")
    c.add_argument("--mask", type=_mask, default=None, help="one backward with this output_mask (e.g. 101)")
    c.add_argument("-V", "--verify", type=int, nargs="?", const=1, default=0, choices=(0, 1),
                   help="verify against PyTorch in float64 with the conformance tolerance")
    c.add_argument("-t", "--time", type=int, nargs="?", const=1, default=0, choices=(0, 1),
                   help="time each step: median of --iter runs, wall clock with device sync")
    c.add_argument("-i", "--iter", type=int, default=10, help="timed iterations (default 10)")
    c.set_defaults(func=cmd_conv)

    e = sub.add_parser("explain", help="portconv's plan and the ATen model's answer for one problem")
    add_problem_flags(e)
    e.add_argument("--suite", default=None, help="explain every row of a bench suite JSON file instead")
    e.add_argument("--row", default=None, help="with --suite: only rows whose name contains this")
    e.set_defaults(func=cmd_explain)

    f = sub.add_parser("conform", help="the conformance suite against PyTorch float64 (exit 1 on any failure)")
    f.add_argument("--backend", action="append",
                   help="backend(s) to check (repeatable; default: every available backend but aten)")
    f.add_argument("--dtype", action="append", help="dtype(s), repeatable or comma-separated (default float32,float64)")
    f.add_argument("--json", default=None, metavar="FILE", help="write the JSON report (every case and error) here")
    g = f.add_mutually_exclusive_group()
    g.add_argument("--full", action="store_true", help="the whole grid plus curated cases (default)")
    g.add_argument("--subset", action="store_true", help="the CI subset: every third grid case plus curated")
    f.add_argument("--filter", action="append", metavar="SUBSTR", help="only cases whose id contains SUBSTR")
    f.add_argument("--no-gradcheck", action="store_true", help="skip the float64 gradcheck subset")
    f.add_argument("--device", default=None, help="torch device of the tensors (default: what the backend takes)")
    f.add_argument("--strict", action="store_true", help="unsupported cases count as failures")
    f.add_argument("--list", action="store_true", help="list the selected cases and exit")
    f.add_argument("--fuzz", type=int, default=0, metavar="N",
                   help="N random problems and layouts per backend instead of the grid (Note [fuzzer])")
    f.add_argument("--seed", type=int, default=0, help="with --fuzz: the sequence's seed")
    f.add_argument("--seconds", type=float, default=None, metavar="S", help="with --fuzz: stop after S seconds")
    f.add_argument("--long-reductions", action="store_true",
                   help="float32 gradients over 67M random positions and 2.4e9 ones per own kernel family instead")
    f.add_argument("--custom", metavar="MODULE:FUNCTION", default=None,
                   help="check a user forward kernel (portconv.custom_forward or a plain function) instead")
    f.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    f.set_defaults(func=cmd_conform)
    t = sub.add_parser("tune", help="the tuning cache file: its entries; export or import them (pre-warm a cluster)")
    t.add_argument("--export", metavar="FILE", help="write the cache's valid entries to FILE")
    t.add_argument("--import", dest="import_", metavar="FILE", help="merge FILE's valid entries into the cache")
    t.set_defaults(func=cmd_tune)
    from .bench import add_parser as add_bench_parser  # `portconv bench` (issue 5): portconv/bench/cli.py

    add_bench_parser(sub)
    return p


def main(argv=None) -> int:
    try:
        args = build_parser().parse_args(argv)
        return args.func(args)
    except SystemExit as e:
        return int(e.code or 0)
    except BrokenPipeError:
        return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
