"""Oracle: portconv.rules answers exactly what torch._C._select_conv_backend / _conv_determine_backend_memory_format
answer, for thousands of generated calls on every device this machine has (cpu, meta, and cuda when present)."""
from __future__ import annotations

import contextlib
import dataclasses
import math
import random

import pytest
import torch

from portconv import rules
from portconv.errors import ConvError
from portconv.params import ConvParams
from portconv.tensors import TensorSpec, dense_strides, spec_of

DEVICES = ["cpu", "meta"] + (["cuda"] if torch.cuda.is_available() else [])
RANKS = (1, 2, 3)
DTYPES = ("float32", "float32", "float64", "bfloat16", "float16")
FORMATS = {torch.contiguous_format: "contiguous", torch.channels_last: "channels_last",
           torch.channels_last_3d: "channels_last_3d"}


@dataclasses.dataclass(frozen=True)
class Case:
    rank: int
    transposed: bool
    n: int
    c_in: int
    c_out: int
    groups: int
    spatial: tuple[int, ...]
    kernel: tuple[int, ...]
    stride: tuple[int, ...]
    padding: tuple[int, ...]
    dilation: tuple[int, ...]
    output_padding: tuple[int, ...]
    dtype: str = "float32"
    weight_dtype: str = ""
    layout: str = "contiguous"
    weight_layout: str = "contiguous"
    bias: str = "none"  # 'none', 'tensor', 'sizes' (bias_sizes only)
    requires_grad: bool = False
    mkldnn_input: bool = False
    flags: tuple = ()  # sorted (name, value) pairs, see _flags

    @property
    def params(self) -> ConvParams:
        return ConvParams(self.stride, self.padding, self.dilation, self.transposed, self.output_padding, self.groups)

    @property
    def input_shape(self):
        return (self.n, self.c_in) + self.spatial

    @property
    def weight_shape(self):
        if self.transposed:
            return (self.c_in, self.c_out // self.groups) + self.kernel
        return (self.c_out, self.c_in // self.groups) + self.kernel


# --- tensors in many layouts ------------------------------------------------------------------------------------

def _make(shape, layout, dtype, device):
    dt = getattr(torch, dtype)
    nd = len(shape)
    if layout == "channels_last":  # dense with C innermost, any rank
        perm = (0,) + tuple(range(2, nd)) + (1,)
        inv = sorted(range(nd), key=perm.__getitem__)
        return torch.empty([shape[i] for i in perm], dtype=dt, device=device).permute(inv)
    if layout == "reversed":  # every dim permuted: ascending strides
        return torch.empty(shape[::-1], dtype=dt, device=device).permute(tuple(range(nd - 1, -1, -1)))
    if layout == "sliced":  # every other element of the last dim
        return torch.empty(shape[:-1] + (2 * shape[-1],), dtype=dt, device=device)[..., ::2]
    if layout == "channel_slice":  # channels-last tensor with twice the channels, first half
        return _make((shape[0], 2 * shape[1]) + shape[2:], "channels_last", dtype, device).narrow(1, 0, shape[1])
    if layout == "batch_expanded":  # stride 0 on the batch dim
        return torch.empty((1,) + shape[1:], dtype=dt, device=device).expand(shape)
    if layout == "all_expanded":  # a single element seen everywhere (huge shapes, no memory)
        return torch.empty((1,) * nd, dtype=dt, device=device).expand(shape)
    if layout == "swap_last2" and nd >= 4 and shape[-1] == shape[-2]:
        return torch.empty(shape, dtype=dt, device=device).transpose(-1, -2)
    return torch.empty(shape, dtype=dt, device=device)


def _spec(t) -> TensorSpec:
    if t.layout == torch._mkldnn:  # no strides; only the layout matters to ATen
        return TensorSpec(tuple(t.shape), dense_strides(tuple(t.shape)), str(t.dtype)[6:], "cpu")
    return spec_of(t)


# --- case generation --------------------------------------------------------------------------------------------

def _valid(c: Case) -> bool:
    for i, k, s, p, d, op in zip(c.spatial, c.kernel, c.stride, c.padding, c.dilation, c.output_padding):
        if c.transposed:
            if (i - 1) * s - 2 * p + d * (k - 1) + op + 1 <= 0:
                return False
        elif i + 2 * p < d * (k - 1) + 1:
            return False
    return True


def _random_case(rng: random.Random, rank: int, device: str) -> Case:
    transposed = rng.random() < 0.3
    n = rng.choice((0, 1, 1, 2, 3, 16, 17) if rng.random() < 0.95 else (0,))
    c_in = rng.choice((1, 2, 3, 4, 6, 8))
    if not transposed and rng.random() < 0.03:
        c_in = 0
    g_choices = [1, 1, 2, c_in] if c_in else [1]
    groups = rng.choice([g for g in g_choices if g and c_in % g == 0] or [1])
    c_out = groups * rng.choice((1, 1, 2, 3)) if c_in else rng.choice((1, 2))
    spatial = tuple(rng.choice((1, 2, 3, 5, 7, 9)) for _ in range(rank))
    kernel = tuple(rng.choice((1, 1, 2, 3, 5)) for _ in range(rank))
    stride = tuple(rng.choice((1, 1, 2, 3)) for _ in range(rank))
    padding = tuple(rng.choice((0, 0, 1, 2)) for _ in range(rank))
    dilation = tuple(rng.choice((1, 1, 1, 2)) for _ in range(rank))
    op = tuple(rng.randrange(max(s, d) + (1 if rng.random() < 0.1 else 0)) if transposed else 0
               for s, d in zip(stride, dilation))
    dtype = rng.choice(DTYPES)
    layouts = ["contiguous", "contiguous", "channels_last", "reversed", "sliced", "batch_expanded", "swap_last2"]
    if c_in:
        layouts.append("channel_slice")
    bias = rng.choice(("none", "none", "tensor", "sizes"))
    flags = []
    if device == "cpu":
        flags = [("mkldnn", rng.random() < 0.75), ("nnpack", rng.random() < 0.85), ("threads", rng.choice((1, 2, 2)))]
    elif device == "cuda":
        flags = [("cudnn", rng.random() < 0.8), ("deterministic", rng.random() < 0.2),
                 ("depthwise_kernel", rng.choice(("auto", "auto", "native", "cudnn")))]
    mkldnn_input = device == "cpu" and dtype == "float32" and c_in > 0 and rng.random() < 0.08
    return Case(rank, transposed, n, c_in, c_out, groups, spatial, kernel, stride, padding, dilation, op, dtype,
                dtype if rng.random() < 0.95 else rng.choice(DTYPES), rng.choice(layouts),
                rng.choice(("contiguous", "contiguous", "channels_last", "reversed", "sliced")), bias,
                rng.random() < 0.1 and dtype in ("float32", "float64"), mkldnn_input, tuple(sorted(flags)))


def _curated(rank: int, device: str) -> list[Case]:
    """Thresholds the random cases would rarely hit: oneDNN's 1x1 and 20480-element rules, NNPACK's 16x16
    kernels, padding >= kernel and batch >= 16, fp16 depthwise heuristics, 64-bit problems."""
    out = []
    one = (1,) * rank
    zero = (0,) * rank
    if device == "cpu":
        # N*C*size(2)*size(3) around oneDNN's 20480 (the product ignores W of a 3-d input), 1x1 and 4x4 kernels
        sizes = ((1, 8, (50, 51, 1), 1), (1, 8, (40, 64, 1), 1), (1, 3, (1, 6827, 1), 1), (1, 8, (52, 52, 52), 1),
                 (1, 8, (52, 52, 3), 3), (1, 3, (4, 4, 4), 1), (16, 3, (4, 4, 4), 1), (1, 3, (6, 6, 6), 5),
                 (1, 3, (6, 6, 6), 4), (2, 3, (4, 4, 4), 1))
        for threads in (1, 2):
            for n, c, hw, k in sizes:
                for stride in (1, 2):
                    out.append(Case(rank, False, n, c, 4, 1, hw[-rank:], (k,) * rank, (stride,) * rank, zero, one,
                                    zero, flags=(("mkldnn", True), ("nnpack", True), ("threads", threads))))
        if rank == 2:
            for k, pad in ((16, 0), (17, 0), (3, 3), (3, 2), (1, 1)):
                for mk in (True, False):
                    out.append(Case(2, False, 16, 3, 4, 1, (20, 20), (k, k), one, (pad, pad), one, zero,
                                    flags=(("mkldnn", mk), ("nnpack", True), ("threads", 2))))
    if device == "cuda" and rank == 2:
        for n in (1, 8, 16, 32, 64, 128):
            for c in (32, 256, 512, 1024):
                for w in (7, 14, 28, 56, 112):
                    for k in (1, 3, 5):
                        for s in (1, 2):
                            out.append(Case(2, False, n, c, c, c, (w, w), (k, k), (s, s), (k // 2,) * 2, one, zero,
                                            "float16", "float16", "all_expanded", "contiguous"))
        for c, w in ((32, 7), (64, 56)):
            for lay in ("channels_last", "contiguous"):
                out.append(Case(2, False, 2, c, c, c, (w, w), (3, 3), one, one, one, zero, "float16", "float16",
                                lay, lay))
        for shape in ((1, 1, 65536, 65536), (4, 64, 4096, 4096), (1, 2, 40000, 40000)):
            for groups in (1, shape[1]):
                out.append(Case(2, False, shape[0], shape[1], shape[1], groups, shape[2:], (3, 3), one, one, one,
                                zero, "float16", "float16", "all_expanded", "contiguous"))
    return [c for c in out if _valid(c)]


def cases_for(device: str, rank: int, count: int = 2600) -> list[Case]:
    rng = random.Random(f"{device}-{rank}")
    out = _curated(rank, device)
    while len(out) < count:
        c = _random_case(rng, rank, device)
        if _valid(c):
            out.append(c)
    return out


# --- running torch and the model --------------------------------------------------------------------------------

@contextlib.contextmanager
def _flags(flags: tuple):
    f = dict(flags)
    stack = contextlib.ExitStack()
    with stack:
        if "mkldnn" in f:
            stack.enter_context(torch.backends.mkldnn.flags(enabled=f["mkldnn"]))
        if "nnpack" in f:
            stack.enter_context(torch.backends.nnpack.flags(enabled=f["nnpack"]))
        if "threads" in f:
            old = torch.get_num_threads()
            torch.set_num_threads(f["threads"])
            stack.callback(torch.set_num_threads, old)
        if "cudnn" in f:
            stack.enter_context(torch.backends.cudnn.flags(enabled=f["cudnn"], deterministic=f["deterministic"],
                                                           benchmark=False))
        if "depthwise_kernel" in f and hasattr(torch._C, "_set_cudnn_depthwise_kernel"):
            old_k = torch._C._get_cudnn_depthwise_kernel()
            torch._C._set_cudnn_depthwise_kernel(f["depthwise_kernel"])
            stack.callback(torch._C._set_cudnn_depthwise_kernel, old_k)
        yield


def _check(case: Case, device: str, ctx: rules.TorchContext) -> tuple[str, str, str | None]:
    """(torch's backend, torch's memory format, None or how the model differs)."""
    x = _make(case.input_shape, case.layout, case.dtype, device)
    w = _make(case.weight_shape, case.weight_layout, case.weight_dtype or case.dtype, device)
    if case.mkldnn_input:
        x = torch.zeros(case.input_shape).to_mkldnn()
    out_c = case.c_out if case.transposed else case.weight_shape[0]
    b = _make((out_c,), "contiguous", case.dtype, device) if case.bias == "tensor" else None
    bias_sizes = [out_c] if case.bias == "sizes" else None
    if case.requires_grad:
        x.requires_grad_(True)
    p = case.params
    xs, ws = _spec(x), _spec(w)
    layout = "mkldnn" if case.mkldnn_input else "strided"

    def model():
        return rules.select_conv_backend(xs, ws, _spec(b) if b is not None else None, p, ctx, bias_sizes,
                                         need_backward=case.requires_grad, input_layout=layout)

    try:
        t_backend = torch._C._select_conv_backend(x, w, b, list(p.stride), list(p.padding), list(p.dilation),
                                                  p.transposed, list(p.output_padding), p.groups, bias_sizes)
    except RuntimeError as e:  # ATen refuses the call: the model must refuse it with the same words
        try:
            m_name = model()
        except ConvError as m:
            return "error", "error", None if str(m) in str(e) else f"torch says {e!r}, model says {m!r}"
        return "error", "error", f"torch raised {e!r}, model chose {m_name} for {case}"
    t_name = rules.CONV_BACKENDS[int(t_backend)]
    t_fmt = FORMATS[torch._C._conv_determine_backend_memory_format(x, w, t_backend)]
    m_name = model()
    m_fmt = rules.determine_backend_memory_format(xs, ws, t_name, ctx, input_layout=layout)
    diff = None
    if (m_name, m_fmt) != (t_name, t_fmt):
        diff = f"torch ({t_name}, {t_fmt}) model ({m_name}, {m_fmt}) for {case} x.stride={xs.strides}"
    return t_name, t_fmt, diff


# What each run must have exercised, so that a generator regression cannot make the oracle vacuous.
_CPU = {"Empty", "MkldnnEmpty", "Mkldnn", "MkldnnTranspose", "contiguous"}
_CPU_2D = _CPU | {"NnpackSpatial", "Slow2d", "SlowDilated2d", "SlowTranspose2d"}
_CUDA = {"Empty", "Cudnn", "CudnnTranspose"}
MUST_SEE = {
    ("cpu", 1): _CPU_2D | {"error"},  # a 1-d mkldnn input that oneDNN (disabled) cannot take: no backend
    ("cpu", 2): _CPU_2D | {"channels_last"},
    ("cpu", 3): _CPU | {"Slow3d", "SlowDilated3d", "SlowTranspose3d", "channels_last_3d"},
    ("meta", 1): {"Empty", "Overrideable"},
    ("meta", 2): {"Empty", "Overrideable"},
    ("meta", 3): {"Empty", "Overrideable"},
    ("cuda", 1): _CUDA,
    ("cuda", 2): _CUDA | {"CudaDepthwise2d", "channels_last"},
    ("cuda", 3): _CUDA | {"CudaDepthwise3d", "channels_last_3d"},
}


@pytest.mark.parametrize("rank", RANKS)
@pytest.mark.parametrize("device", DEVICES)
def test_select_and_memory_format_match_torch(device, rank):
    cases = cases_for(device, rank)
    by_flags: dict[tuple, list[Case]] = {}
    for c in cases:
        by_flags.setdefault(c.flags, []).append(c)
    mismatches, seen = [], set()
    for flags, group in sorted(by_flags.items(), key=lambda kv: repr(kv[0])):
        with _flags(flags):
            ctx = rules.TorchContext.from_torch(device)
            for c in group:
                name, fmt, diff = _check(c, device, ctx)
                seen |= {name, fmt}
                if diff:
                    mismatches.append(diff)
    assert not mismatches, f"{len(mismatches)} of {len(cases)} cases differ:\n" + "\n".join(mismatches[:15])
    assert MUST_SEE[(device, rank)] <= seen, f"never exercised: {sorted(MUST_SEE[(device, rank)] - seen)}"


@pytest.mark.parametrize("device", DEVICES)
def test_zero_size_spatial_input_raises_like_torch(device):
    """A transposed input with an empty spatial dim passes the shape checks; both refuse it in selection."""
    x = torch.empty(2, 3, 0, 4, device=device)
    w = torch.empty(3, 2, 3, 3, device=device)
    p = ConvParams((1, 1), (0, 0), (1, 1), True, (0, 0), 1)
    with pytest.raises(RuntimeError) as t_err:
        torch._C._select_conv_backend(x, w, None, [1, 1], [0, 0], [1, 1], True, [0, 0], 1, None)
    with pytest.raises(ConvError) as m_err:
        rules.select_conv_backend(spec_of(x), spec_of(w), None, p, rules.TorchContext.from_torch(device))
    assert str(m_err.value) in str(t_err.value)



# --- aten_answer against what _convolution really did: the layout of its output ---------------------------------

def _out_format_ok(out: torch.Tensor, fmt: str) -> tuple[bool, bool]:
    """(the output is dense in ``fmt``, only ``fmt`` fits) with a 1-d output seen as the 2-d one ATen computed."""
    o = out.unsqueeze(2) if out.dim() == 3 else out
    mf = {"contiguous": torch.contiguous_format, "channels_last": torch.channels_last,
          "channels_last_3d": torch.channels_last_3d}
    fits = [name for name, m in mf.items() if (name == "contiguous" or (o.dim() == 4) == (name == "channels_last"))
            and o.is_contiguous(memory_format=m)]
    return fmt in fits, fits == [fmt]


@pytest.mark.parametrize("rank", RANKS)
def test_aten_answer_predicts_the_layout_convolution_computes_in(rank):
    """Run the real CPU convolution (explicit padding and padding='same') and check its output is dense in the
    memory format aten_answer names; this covers what the selection oracle cannot see: the 1-d -> 2-d view
    (contiguous() then unsqueeze) and convolution_same's padded copy."""
    from portconv.problem import Problem

    with _flags((("threads", 1),)):  # one thread: the runs below are cheap and the machine may be busy
        _check_layouts(rank, Problem)


def _check_layouts(rank, Problem):
    rng = random.Random(f"layout-{rank}")
    ctx = rules.TorchContext.from_torch("cpu")
    checked = decisive = 0
    failures = []
    for c in cases_for("cpu", rank, 600):
        runnable = all(op < max(s, d) for op, s, d in zip(c.output_padding, c.stride, c.dilation))
        small = c.n * c.c_in * math.prod(c.spatial) * math.prod(c.kernel) <= 20000
        if c.n == 0 or c.c_in == 0 or c.mkldnn_input or not runnable or not small:
            continue
        same = not c.transposed and rng.random() < 0.3
        dtype = c.dtype if c.dtype in ("float32", "float64") else "float32"
        x = _make(c.input_shape, c.layout, dtype, "cpu")
        w = _make(c.weight_shape, c.weight_layout, dtype, "cpu")
        if same:
            fn = (torch.nn.functional.conv1d, torch.nn.functional.conv2d, torch.nn.functional.conv3d)[rank - 1]
            params = ConvParams.make(rank, padding="same", dilation=c.dilation, groups=c.groups,
                                     weight_shape=c.weight_shape)
            out = fn(x, w, None, 1, "same", c.dilation, c.groups)
        else:
            params = c.params
            out = torch.ops.aten.convolution(x, w, None, list(params.stride), list(params.padding),
                                             list(params.dilation), params.transposed, list(params.output_padding),
                                             params.groups)
        backend, fmt = rules.aten_answer(Problem(params, spec_of(x), spec_of(w), False), ctx)
        if backend in ("Empty", "NnpackSpatial", "Slow3d", "SlowDilated3d", "SlowTranspose3d"):
            continue  # these compute contiguous and the model says so; their output layout is not the evidence
        ok, only = _out_format_ok(out, fmt)
        checked += 1
        decisive += only
        if not ok:
            failures.append(f"{backend} {fmt} but out.stride={out.stride()} for {c} same={same} x={x.stride()}")
    assert not failures, f"{len(failures)} of {checked}:\n" + "\n".join(failures[:10])
    print(f"rank {rank}: {checked} convolutions checked, {decisive} with only one layout fitting")
    assert checked >= 150 and decisive >= 100, (checked, decisive)


@pytest.mark.parametrize("mkldnn", [True, False])
def test_aten_backend_choice_names_atens_backend(mkldnn):
    from portconv import backends
    from portconv.device import host_cpu
    from portconv.knobs import Options
    from portconv.problem import Problem

    x = torch.randn(2, 3, 8, 8).to(memory_format=torch.channels_last)
    w = torch.randn(4, 3, 3, 3)
    problem = Problem(ConvParams.make(2), spec_of(x), spec_of(w), False)
    with torch.backends.mkldnn.flags(enabled=mkldnn):
        choice = backends.get("aten").choose(problem, host_cpu(), Options())
        t = torch._C._select_conv_backend(x, w, None, [1, 1], [0, 0], [1, 1], False, [0, 0], 1, None)
    assert choice.algorithm == "aten:" + rules.CONV_BACKENDS[int(t)]
    assert choice.memory_format == FORMATS[torch._C._conv_determine_backend_memory_format(x, w, t)]
