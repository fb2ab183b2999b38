"""The opencl backend against PyTorch in float64: every direction, dtype, layout and tensor type it takes."""
from __future__ import annotations

import dataclasses
import sys

import pytest
import torch
import torch.nn.functional as F
from conftest import require_backend

import portconv
from portconv.backends import Problem, get
from portconv.backends import _cl_runtime as rt
from portconv.backends.opencl import output_memory_format
from portconv.errors import Unsupported
from portconv.params import ConvParams
from portconv.plan import select
from portconv.tensors import TensorSpec, spec_of

# error relative to max|reference|: output rounding (half: 2^-11, bfloat16: 2^-8) plus accumulation
TOL = {torch.float64: 1e-10, torch.float32: 2e-5, torch.float16: 2e-3, torch.bfloat16: 1e-2}
TOL_TF32 = 1e-2  # float32 plans whose math is 'tf32' (Note [OpenCL tensor cores]): operands rounded to 10 bits


def tol(plan, dtype) -> float:
    return TOL_TF32 if plan.math == "tf32" else TOL[dtype]


CL_FMT = {2: torch.channels_last, 3: torch.channels_last_3d}


@pytest.fixture(autouse=True)
def _opencl(monkeypatch):
    monkeypatch.setenv("PORTCONV_POISON", "1")  # unwritten output elements stay NaN and fail the comparison
    # the FMA tiles unless a test asks for the tensor-core tile (test_igemm_tensor_core_*: the tile's own tests; the
    # conformance grid runs the default, tensor cores on NVIDIA GPUs of sm_80+)
    monkeypatch.setenv("PORTCONV_OPENCL_TC", "off")
    require_backend("opencl")


def reference(x, w, b, p: ConvParams, go, mask=(True, True, True)):
    """aten.convolution / convolution_backward on float64 copies (padding='same''s extra padding applied first)."""
    x64, w64 = x.detach().double(), w.detach().double()
    pads = [v for e in reversed(p.padding_extra) for v in (0, e)]
    xp = F.pad(x64, pads) if any(p.padding_extra) else x64
    y = torch.ops.aten.convolution(xp, w64, None if b is None else b.detach().double(), **p.as_aten())
    if go is None:
        return y, None, None, None
    bias_sizes = [w.shape[1] * p.groups if p.transposed else w.shape[0]]
    gi, gw, gb = torch.ops.aten.convolution_backward(go.double(), xp, w64, bias_sizes, **p.as_aten(),
                                                     output_mask=list(mask))
    if gi is not None and any(p.padding_extra):
        gi = gi[(slice(None), slice(None)) + tuple(slice(0, s) for s in x.shape[2:])]
    return y, gi, gw, gb


def check(out, ref, dtype, what, tol=None):
    assert out is not None, what
    assert out.dtype == dtype, f"{what}: dtype {out.dtype}"
    assert tuple(out.shape) == tuple(ref.shape), f"{what}: shape {tuple(out.shape)} != {tuple(ref.shape)}"
    out64 = out.double()
    assert torch.isfinite(out64).all(), f"{what}: {int((~torch.isfinite(out64)).sum())} non-finite elements"
    assert torch.isfinite(ref).all(), f"{what}: reference not finite"
    err = (out64 - ref).abs().max().item() if ref.numel() else 0.0
    scale = max(ref.abs().max().item() if ref.numel() else 0.0, 1e-6)
    assert err <= (tol or TOL[dtype]) * scale, f"{what}: max abs error {err:.3g} vs max |ref| {scale:.3g}"


# (id, rank, N, Cin, Cout, spatial, kernel, stride, padding, dilation, groups, transposed, output_padding)
CASES = [
    ("1d", 1, 2, 3, 4, (17,), (3,), 1, 1, 1, 1, False, 0),
    ("1d-stride-dil", 1, 2, 4, 6, (23,), (3,), 2, 3, 2, 2, False, 0),
    ("1d-depthwise-m2", 1, 2, 3, 6, (16,), (5,), 1, 2, 1, 3, False, 0),
    ("1d-transposed", 1, 2, 4, 3, (9,), (4,), 2, 1, 1, 1, True, 1),
    ("1d-same-even", 1, 1, 2, 3, (12,), (4,), 1, "same", 1, 1, False, 0),
    ("2d", 2, 2, 3, 5, (9, 8), (3, 3), 1, 1, 1, 1, False, 0),
    ("2d-stride-pad-dil", 2, 2, 4, 6, (13, 11), (3, 2), (2, 3), (1, 0), (1, 2), 2, False, 0),
    ("2d-groups3", 2, 1, 6, 9, (7, 7), (3, 3), 1, 1, 1, 3, False, 0),
    ("2d-depthwise-m1", 2, 2, 4, 4, (10, 9), (3, 3), 1, 1, 1, 4, False, 0),
    ("2d-depthwise-m2", 2, 2, 3, 6, (11, 10), (3, 3), 2, 1, 1, 3, False, 0),
    ("2d-pointwise-s2", 2, 2, 5, 4, (8, 7), (1, 1), 2, 0, 1, 1, False, 0),
    ("2d-kernel-over-input", 2, 1, 2, 3, (3, 4), (5, 5), 1, 2, 1, 1, False, 0),
    ("2d-transposed", 2, 2, 4, 3, (5, 6), (3, 3), 2, 1, 1, 1, True, 1),
    ("2d-transposed-groups-dil", 2, 1, 4, 6, (5, 4), (3, 2), (2, 1), (1, 0), 2, 2, True, (1, 0)),
    ("2d-transposed-depthwise", 2, 2, 3, 3, (6, 5), (3, 3), 2, 1, 1, 3, True, 1),
    ("2d-same-even", 2, 2, 3, 4, (8, 7), (2, 4), 1, "same", 1, 1, False, 0),
    ("2d-same-dil", 2, 1, 2, 2, (9, 9), (2, 3), 1, "same", 2, 1, False, 0),
    ("2d-long-reduction", 2, 4, 2, 3, (26, 25), (3, 3), 1, 1, 1, 1, False, 0),
    ("3d", 3, 2, 2, 3, (5, 6, 4), (3, 3, 2), 1, 1, 1, 1, False, 0),
    ("3d-stride-dil", 3, 1, 4, 4, (7, 6, 7), (2, 3, 2), (2, 1, 3), (0, 1, 1), (2, 1, 1), 2, False, 0),
    ("3d-transposed", 3, 1, 2, 3, (3, 4, 3), (3, 2, 3), 2, 1, 1, 1, True, 1),
    ("3d-depthwise-m2", 3, 2, 2, 4, (4, 5, 4), (3, 3, 3), 1, 1, 1, 2, False, 0),
    ("3d-same-even", 3, 1, 2, 2, (5, 4, 6), (2, 2, 4), 1, "same", 1, 1, False, 0),
]
DTYPES = {"f32": torch.float32, "f64": torch.float64, "f16": torch.float16, "bf16": torch.bfloat16}
# each case in float32 and float64 contiguous; the other dtypes and layouts on a spread of cases
VARIANTS = [("f32", "contiguous"), ("f64", "contiguous")]
EXTRA = {"2d": [("f16", "contiguous"), ("bf16", "contiguous"), ("f32", "channels_last"), ("f32", "noncontig")],
         "2d-depthwise-m1": [("f32", "channels_last"), ("bf16", "channels_last")],
         "2d-depthwise-m2": [("f16", "noncontig"), ("f64", "weight_cl")],
         "2d-transposed": [("f16", "channels_last"), ("bf16", "noncontig")],
         "2d-transposed-groups-dil": [("bf16", "contiguous")],
         "2d-same-even": [("f16", "contiguous"), ("f64", "channels_last")],
         "1d-depthwise-m2": [("bf16", "contiguous"), ("f32", "noncontig")],
         "1d-transposed": [("f16", "contiguous")],
         "3d": [("f32", "channels_last"), ("bf16", "contiguous")],
         "3d-depthwise-m2": [("f16", "channels_last")],
         "3d-transposed": [("f32", "noncontig")]}
PARAMS = [pytest.param(c, dt, fmt, id=f"{c[0]}-{dt}-{fmt}") for c in CASES
          for dt, fmt in VARIANTS + EXTRA.get(c[0], [])]


def make(case, dtype, fmt, bias=True, seed=0):
    """(x, w, b, ConvParams) for a case; fmt picks the memory layout of x (or of w) or a strided view."""
    _, rank, n, cin, cout, sp, k, stride, padding, dilation, groups, transposed, out_pad = case
    g = torch.Generator().manual_seed(seed)
    wshape = (cin, cout // groups, *k) if transposed else (cout, cin // groups, *k)
    if fmt == "noncontig":  # every other channel and a shifted window of a bigger tensor
        big = torch.randn(n, 2 * cin, *(s + 2 for s in sp), generator=g).to(dtype)
        x = big[(slice(None), slice(None, None, 2)) + tuple(slice(1, 1 + s) for s in sp)]
    else:
        x = torch.randn(n, cin, *sp, generator=g).to(dtype)
    w = torch.randn(*wshape, generator=g).to(dtype)
    b = torch.randn(cout, generator=g).to(dtype) if bias else None
    if fmt == "channels_last":
        x = x.contiguous(memory_format=CL_FMT[rank])
    if fmt == "weight_cl":
        w = w.contiguous(memory_format=CL_FMT[rank])
    p = ConvParams.make(rank, stride, padding, dilation, transposed, out_pad, groups, weight_shape=w.shape)
    return x, w, b, p


def opencl_plan(x, w, b, p):
    return select(Problem(p, spec_of(x), spec_of(w), b is not None), "opencl")


def _dense_default(plan) -> str:
    """The algorithm of a dense problem with no PORTCONV_OPENCL_DENSE (Note [OpenCL dense algorithm])."""
    from portconv.backends import _cl_igemm

    return _cl_igemm.DENSE_CPU_DEFAULT if plan.device.kind == "cpu" else _igemm_alg(plan)


def _igemm_alg(plan) -> str:
    """'igemm-tc' where the plan's device and dtype take the tensor-core tile (Note [OpenCL tensor cores]), else
    'igemm'."""
    from portconv.backends import _cl_igemm

    return "igemm-tc" if _cl_igemm.tc_mode(plan.problem.dtype, plan.device)[0] else "igemm"


@pytest.mark.parametrize("case,dt,fmt", PARAMS)
def test_against_float64_reference(case, dt, fmt):
    dtype = DTYPES[dt]
    x, w, b, p = make(case, dtype, fmt)
    saved = [(t.clone(), t.stride()) for t in (x, w, b)]
    plan = opencl_plan(x, w, b, p)
    assert plan.backend == "opencl" and plan.reason
    y = plan.forward(x, w, b)
    go = torch.randn(y.shape, generator=torch.Generator().manual_seed(1)).to(dtype)
    gi, gw, gb = plan.backward(go, x, w, (True, True, True))
    ry, rgi, rgw, rgb = reference(x, w, b, p, go)
    for out, ref, name in ((y, ry, "output"), (gi, rgi, "grad_input"), (gw, rgw, "grad_weight"),
                           (gb, rgb, "grad_bias")):
        check(out, ref, dtype, name, tol(plan, dtype))
    for t, (copy, stride) in zip((x, w, b), saved):
        assert torch.equal(t, copy) and t.stride() == stride, "a caller tensor was modified"
    want = output_memory_format(plan.problem)[0]
    assert plan.memory_format == want
    if want != "contiguous":
        mf = CL_FMT[p.rank]
        assert y.is_contiguous(memory_format=mf) and gi.is_contiguous(memory_format=mf)
        assert gw.is_contiguous(memory_format=mf)
    else:
        assert y.is_contiguous() and gi.is_contiguous() and gw.is_contiguous()
    expect_alg = "depthwise" if case[0].endswith(("depthwise-m1", "depthwise-m2", "transposed-depthwise")) \
        else _dense_default(plan)
    assert plan.algorithm == expect_alg + ("-transposed" if p.transposed else "")
    assert plan.math == ("fp32-accumulate" if dt in ("f16", "bf16") else
                         "tf32" if plan.algorithm.startswith("igemm-tc") else "ieee")


MASKS = [(True, False, False), (False, True, False), (False, False, True), (True, True, False), (False, True, True)]


@pytest.mark.parametrize("mask", MASKS, ids=lambda m: "".join("1" if v else "0" for v in m))
@pytest.mark.parametrize("transposed", [False, True], ids=["conv", "transposed"])
def test_output_mask_launches_only_what_is_asked(mask, transposed):
    case = CASES[13] if transposed else CASES[6]
    x, w, b, p = make(case, torch.float32, "contiguous")
    plan = opencl_plan(x, w, b, p)
    go = torch.randn(p.output_shape(x.shape, w.shape))
    before = dict(rt.stats)
    got = plan.backward(go, x, w, mask)
    # direct (conv.cl) and implicit-GEMM (igemm.cl, "ig_") launches of each kind together
    launched = {k: sum(rt.stats[n] - before.get(n, 0) for n in (k, "ig_" + k))
                for k in ("fwd", "bwd_data", "bwd_weight", "bias_grad")}
    data_kernel = "fwd" if transposed else "bwd_data"
    assert launched == {"fwd": 0, "bwd_data": 0, data_kernel: int(mask[0]), "bwd_weight": int(mask[1]),
                        "bias_grad": int(mask[2])}
    refs = reference(x, w, b, p, go, mask)[1:]
    for m, out, ref, name in zip(mask, got, refs, ("grad_input", "grad_weight", "grad_bias")):
        if m:
            check(out, ref, torch.float32, name)
        else:
            assert out is None, name
    before = dict(rt.stats)
    assert plan.backward(go, x, w, (False, False, False)) == (None, None, None)
    assert dict(rt.stats) == before


def test_expanded_grad_output_and_sliced_bias():
    x, w, _, p = make(CASES[5], torch.float64, "contiguous")
    bias = torch.randn(10, dtype=torch.float64)[::2]  # stride-2 bias view
    plan = opencl_plan(x, w, bias, p)
    y = plan.forward(x, w, bias)
    go = torch.tensor(0.75, dtype=torch.float64).expand(y.shape)  # what sum().backward() hands over: stride 0
    got = plan.backward(go, x, w, (True, True, True))
    ry, *refs = reference(x, w, bias, p, go)
    check(y, ry, torch.float64, "output")
    for out, ref, name in zip(got, refs, ("grad_input", "grad_weight", "grad_bias")):
        check(out, ref, torch.float64, name)


def test_pyopencl_arrays_in_and_out():
    cl = pytest.importorskip("pyopencl")  # present whenever the backend is available
    import numpy as np
    import pyopencl.array as cla

    dev = next(e[2] for e in rt.all_devices() if e[:2] == rt.default_index())
    ctx = cl.Context([dev])
    q = cl.CommandQueue(ctx)
    x, w, b, p = make(CASES[6], torch.float32, "contiguous")
    xcl = x.contiguous(memory_format=torch.channels_last)
    mf = cl.mem_flags
    xbuf = cl.Buffer(ctx, mf.READ_WRITE | mf.COPY_HOST_PTR, hostbuf=xcl.permute(0, 2, 3, 1).contiguous().numpy())
    arrays = {"contiguous": cla.to_device(q, x.numpy()),
              "channels_last": cla.Array(q, x.shape, np.float32, strides=tuple(4 * s for s in xcl.stride()),
                                         data=xbuf)}
    wa, ba = cla.to_device(q, w.numpy()), cla.to_device(q, b.numpy())

    def host(a):  # read any dense array (pyopencl's get() only takes C/F order)
        flat = np.empty(a.size, a.dtype)
        cl.enqueue_copy(q, flat, a.base_data, src_offset=a.offset)
        return torch.from_numpy(np.lib.stride_tricks.as_strided(flat, a.shape, a.strides).copy())

    go = torch.randn(p.output_shape(x.shape, w.shape))
    ry, *refs = reference(x, w, b, p, go)
    for fmt, xa in arrays.items():
        plan = portconv.plan(xa, wa, ba, stride=p.stride, padding=p.padding, dilation=p.dilation, groups=p.groups,
                             backend="opencl")
        assert plan.memory_format == fmt and plan.device.index.startswith("opencl:")
        y = plan.forward(xa, wa, ba)
        assert isinstance(y, cla.Array) and y.context == ctx
        check(host(y), ry, torch.float32, f"{fmt} output")
        got = plan.backward(cla.to_device(q, go.numpy()), xa, wa, (True, True, True))
        for out, ref, name in zip(got, refs, ("grad_input", "grad_weight", "grad_bias")):
            assert isinstance(out, cla.Array)
            check(host(out), ref, torch.float32, f"{fmt} {name}")
        assert torch.equal(host(xa), x) and torch.equal(host(wa), w), "a caller array was modified"


@pytest.mark.parametrize("transposed", [False, True], ids=["conv2d", "conv_transpose2d"])
def test_autograd_backward(transposed):
    g = torch.Generator().manual_seed(3)
    x = torch.randn(2, 4, 7, 6, generator=g, requires_grad=True)
    w = torch.randn(4, 3 if transposed else 2, 3, 3, generator=g, requires_grad=True)
    b = torch.randn(6 if transposed else 4, generator=g, requires_grad=True)
    if transposed:
        out = portconv.conv_transpose2d(x, w, b, stride=2, padding=1, output_padding=1, groups=2, backend="opencl")
        ref = F.conv_transpose2d(x.double(), w.double(), b.double(), stride=2, padding=1, output_padding=1, groups=2)
    else:
        out = portconv.conv2d(x, w, b, stride=2, padding=1, groups=2, backend="opencl")
        ref = F.conv2d(x.double(), w.double(), b.double(), stride=2, padding=1, groups=2)
    gy = torch.randn(out.shape, generator=g)
    out.backward(gy)
    grads = torch.autograd.grad(ref, (x, w, b), gy.double())
    check(out.detach(), ref.detach(), torch.float32, "output")
    for t, r, name in zip((x, w, b), grads, ("x.grad", "w.grad", "b.grad")):
        check(t.grad, r, torch.float32, name)


def test_gradcheck_float64():
    g = torch.Generator().manual_seed(4)
    x = torch.randn(1, 2, 5, 4, dtype=torch.float64, generator=g, requires_grad=True)
    w = torch.randn(4, 1, 2, 3, dtype=torch.float64, generator=g, requires_grad=True)
    b = torch.randn(4, dtype=torch.float64, generator=g, requires_grad=True)
    fn = lambda x, w, b: portconv.conv2d(x, w, b, stride=(1, 2), padding=1, dilation=(2, 1), groups=2,  # noqa: E731
                                         backend="opencl")
    assert torch.autograd.gradcheck(fn, (x, w, b))


def test_idx64_variant_and_determinism(monkeypatch):
    x, w, b, p = make(CASES[18], torch.float32, "noncontig")
    plan = opencl_plan(x, w, b, p)
    go = torch.randn(p.output_shape(x.shape, w.shape))
    first = plan.backward(go, x, w, (True, True, True))
    again = plan.backward(go, x, w, (True, True, True))
    assert all(torch.equal(a, b_) for a, b_ in zip(first, again)), "reductions are not deterministic"
    monkeypatch.setattr(rt, "force_idx64", True)
    y = plan.forward(x, w, b)
    got = plan.backward(go, x, w, (True, True, True))
    ry, *refs = reference(x, w, b, p, go)
    check(y, ry, torch.float32, "output (IDX64)")
    for out, ref, name in zip(got, refs, ("grad_input", "grad_weight", "grad_bias")):
        check(out, ref, torch.float32, f"{name} (IDX64)")


def test_programs_are_built_once_per_define_set():
    for i in range(2):  # the first pass may build; the second must only look up
        before = rt.stats["programs_built"]
        for n, c, hw, k, s in ((1, 3, 9, 3, 1), (2, 5, 12, 2, 2), (3, 2, 6, 1, 1), (1, 7, 15, 5, 3)):
            x, w = torch.randn(n, c, hw, hw + 1), torch.randn(4, c, k, k)
            y = portconv.conv2d(x, w, stride=s, backend="opencl")
            check(y, F.conv2d(x.double(), w.double(), stride=s), torch.float32, "output")
        if i:
            assert rt.stats["programs_built"] == before


def test_poison_fills_outputs_with_nan():
    runtime = rt.runtime_for_index(rt.info(*rt.default_index()).index)
    like = torch.empty(0)
    for dtype in ("float32", "float64", "float16", "bfloat16"):
        out = runtime.empty((2, 3), (3, 1), dtype, like, runtime.queue)
        assert torch.isnan(runtime.result(out, dtype, like, runtime.queue, None)).all(), dtype


def test_unsupported_reasons():
    impl = get("opencl")
    p = ConvParams.make(2, 1, 0, 1)
    cuda = TensorSpec((1, 2, 4, 4), (32, 16, 4, 1), "float32", "cuda", 0)
    with pytest.raises(Unsupported, match="takes CPU tensors or pyopencl arrays"):
        impl.device_for(Problem(p, cuda, dataclasses.replace(cuda, shape=(3, 2, 3, 3), strides=(18, 9, 3, 1)), False))
    x, w = spec_of(torch.zeros(1, 2, 4, 4)), spec_of(torch.zeros(3, 2, 3, 3))
    device = impl.device_for(Problem(p, x, w, False))
    ints = Problem(p, dataclasses.replace(x, dtype="int32"), dataclasses.replace(w, dtype="int32"), False)
    with pytest.raises(Unsupported, match="not int32"):
        impl.choose(ints, device)
    f64 = Problem(p, dataclasses.replace(x, dtype="float64"), dataclasses.replace(w, dtype="float64"), False)
    with pytest.raises(Unsupported, match="no double precision"):
        impl.choose(f64, dataclasses.replace(device, fp64=False))
    assert impl.choose(f64, dataclasses.replace(device, fp64=True, kind="gpu")).algorithm == "igemm"


def test_probe_without_pyopencl_names_the_extra(monkeypatch):
    rt.select.cache_clear()
    monkeypatch.setitem(sys.modules, "pyopencl", None)
    try:
        avail = rt.select(None)[0]
    finally:
        rt.select.cache_clear()
    assert not avail and "pip install portconv[pocl]" in avail.reason


def test_a_device_whose_compiler_fails_is_passed_over_with_the_reason(monkeypatch):
    """Note [compiler probe]: chosen by type or default, a device is taken only once its compiler builds a one-line
    kernel (pyopencl's bundled PoCL 3.0 fails with "unknown target CPU 'generic'" on CPUs its LLVM 14 does not know);
    the reason names the device passed over; with no device left the backend is unavailable, saying what to install;
    a device named by index is taken as named."""
    import types

    cpu = rt.cl().device_type.CPU

    def fake(name, version):
        return types.SimpleNamespace(name=name, type=cpu, int_ptr=id(name), platform=types.SimpleNamespace(
            name="Portable Computing Language", version=version))

    old, new = fake("pthread-AMD EPYC", "PoCL 3.0-rc2"), fake("pthread-znver-AMD EPYC", "PoCL 6.0")
    broken = {old.int_ptr: "unknown target CPU 'generic'"}
    monkeypatch.setattr(rt, "compiler_problem", lambda d: broken.get(d.int_ptr))
    monkeypatch.setattr(rt, "all_devices", lambda: [(0, 0, old), (1, 0, new)])
    rt.select.cache_clear()
    try:
        avail, pd = rt.select("cpu")
        assert avail and pd == (1, 0) and "passed over (compiler failed): 0:0 pthread-AMD EPYC" in avail.reason
        assert "unknown target CPU 'generic'" in avail.reason
        assert rt.select(None)[1] == (1, 0) and rt.select("0:0")[1] == (0, 0)
        monkeypatch.setattr(rt, "all_devices", lambda: [(0, 0, old)])
        rt.select.cache_clear()
        avail, pd = rt.select(None)
        assert not avail and pd is None and "no usable OpenCL device" in avail.reason
        assert "unknown target CPU 'generic'" in avail.reason and "pocl-opencl-icd" in avail.reason
    finally:
        rt.select.cache_clear()


def test_the_compiler_probe_passes_on_the_chosen_device():
    p, d = rt.default_index()
    dev = next(e[2] for e in rt.all_devices() if (e[0], e[1]) == (p, d))
    assert rt.compiler_problem(dev) is None


def test_device_selection_and_listing(monkeypatch):
    devs = rt.all_devices()
    infos = get("opencl").devices()
    assert len(infos) == len(devs) and all(i.runtime == "opencl" for i in infos)
    p, d, dev = devs[-1]
    assert rt.select(f"{p}:{d}")[1] == (p, d)
    assert rt.select(dev.name.strip()[:6].upper())[1] is not None  # case-insensitive substring
    miss = rt.select("no-such-opencl-device")[0]
    assert not miss and dev.name.strip() in miss.reason
    monkeypatch.setenv("PORTCONV_OPENCL_DEVICE", f"{p}:{d}")
    x, w = torch.randn(1, 2, 5, 5), torch.randn(3, 2, 3, 3)
    plan = portconv.plan(x, w, backend="opencl")
    assert plan.device.index == f"opencl:{p}:{d}"


def test_memory_format_rule_table():
    def problem(xshape, xfmt, wfmt):
        from portconv.tensors import dense_strides

        wshape = (4, xshape[1]) + (3,) * (len(xshape) - 2)
        xs = TensorSpec(xshape, dense_strides(xshape, xfmt), "float32", "cpu")
        ws = TensorSpec(wshape, dense_strides(wshape, wfmt), "float32", "cpu")
        return Problem(ConvParams.make(len(xshape) - 2), xs, ws, False)

    table = [((2, 3, 8, 8), "contiguous", "contiguous", "contiguous"),
             ((2, 3, 8, 8), "channels_last", "contiguous", "channels_last"),
             ((2, 3, 8, 8), "contiguous", "channels_last", "channels_last"),
             ((2, 3, 4, 8, 8), "channels_last_3d", "contiguous", "channels_last_3d"),
             ((2, 3, 4, 8, 8), "contiguous", "channels_last_3d", "channels_last_3d"),
             ((2, 3, 8), "contiguous", "contiguous", "contiguous")]
    for xshape, xfmt, wfmt, want in table:
        assert output_memory_format(problem(xshape, xfmt, wfmt))[0] == want, (xshape, xfmt, wfmt)


# --- the vectorised depthwise kernels (opencl/depthwise.cl, Note [depthwise kernels]) ---------------------

DW_KERNELS = ("dw_fwd", "dw_bwd_data", "dw_bwd_weight", "dw_finalize", "fwd", "bwd_data", "bwd_weight")


def _dw_case(shape, k, stride=1, padding=1, mult=1, n=2, dtype=torch.float32, fmt="contiguous", seed=0):
    """A depthwise problem (x of (n, *shape), weight (C*mult, 1, *k)) with bias, as (x, w, b, ConvParams)."""
    g = torch.Generator().manual_seed(seed)
    c, rank = shape[0], len(shape) - 1
    x = torch.randn(n, *shape, generator=g).to(dtype)
    w = torch.randn(c * mult, 1, *k, generator=g).to(dtype)
    b = torch.randn(c * mult, generator=g).to(dtype)
    if fmt == "channels_last":
        x = x.contiguous(memory_format=CL_FMT[rank])
    elif fmt == "w_strided":  # every other column of a wider tensor: rows not contiguous along W
        x = torch.randn(n, *shape[:-1], 2 * shape[-1], generator=g).to(dtype)[..., ::2]
    p = ConvParams.make(rank, stride, padding, 1, False, 0, c, weight_shape=w.shape)
    return x, w, b, p


def _run_all(x, w, b, p, dtype, kernels=DW_KERNELS, go_like_y=False):
    """Forward and all three gradients against the float64 reference; returns the plan and which of ``kernels``
    were launched how often. ``go_like_y``: grad_output in the output's strides (else contiguous)."""
    plan = opencl_plan(x, w, b, p)
    before = dict(rt.stats)
    y = plan.forward(x, w, b)
    go = torch.randn(y.shape, generator=torch.Generator().manual_seed(1)).to(dtype)
    if go_like_y:
        go = torch.empty_strided(y.shape, y.stride(), dtype=dtype).copy_(go)
    got = plan.backward(go, x, w, (True, True, True))
    ry, *refs = reference(x, w, b, p, go)
    check(y, ry, dtype, "output", tol(plan, dtype))
    for out, ref, name in zip(got, refs, ("grad_input", "grad_weight", "grad_bias")):
        check(out, ref, dtype, name, tol(plan, dtype))
    return plan, {k: rt.stats[k] - before.get(k, 0) for k in kernels if rt.stats[k] - before.get(k, 0)}


DW_EDGES = [  # (id, shape (C, *spatial), kernel, stride, padding, channel multiplier, batch)
    ("w13-not-multiple-of-8", (3, 9, 13), (3, 3), 1, 1, 1, 2),
    ("w5-narrower-than-a-vector", (4, 6, 5), (3, 3), 1, 1, 1, 1),
    ("1x1-image-pad1", (2, 1, 1), (3, 3), 1, 1, 1, 2),
    ("2x3-image-pad2", (2, 2, 3), (3, 3), 1, 2, 1, 1),
    ("pad2-stride2-w17", (3, 11, 17), (3, 3), 2, 2, 1, 3),
    ("stride2-pad0-w20", (2, 9, 20), (3, 3), 2, 0, 1, 2),
    ("stride2-odd-w29", (2, 7, 29), (3, 3), 2, 1, 2, 1),
    ("mult2-w37", (3, 20, 37), (3, 3), 1, 1, 2, 2),
    ("5x5-pad2-w19", (3, 17, 19), (5, 5), 1, 2, 1, 2),
    ("5x5-stride2-w23", (2, 12, 23), (5, 5), 2, 2, 1, 1),
    ("3d-3x3x3", (2, 5, 9, 10), (3, 3, 3), 1, 1, 1, 2),
    ("3d-stride2-pad2", (2, 6, 7, 18), (3, 3, 3), 2, 2, 2, 1),
    ("1d-k3-w29", (3, 29), (3,), 1, 1, 1, 2),
    ("1d-k3-stride2-w31", (3, 31), (3,), 2, 0, 1, 2),
]


@pytest.mark.parametrize("dt", ["f32", "f64", "bf16"])
@pytest.mark.parametrize("edge", DW_EDGES, ids=lambda e: e[0])
def test_depthwise_kernels_edge_shapes(edge, dt):
    _, shape, k, stride, padding, mult, n = edge
    dtype = DTYPES[dt]
    x, w, b, p = _dw_case(shape, k, stride, padding, mult, n, dtype)
    plan, launched = _run_all(x, w, b, p, dtype)
    assert plan.algorithm == "depthwise"
    assert "opencl/depthwise.cl" in plan.reason and "dw_fwd" in plan.reason and "dw_bwd_weight" in plan.reason
    assert launched.get("dw_fwd") == 1 and launched.get("dw_bwd_data") == 1 and launched.get("dw_bwd_weight") == 1
    assert not any(launched.get(kn) for kn in ("fwd", "bwd_data", "bwd_weight")), launched


@pytest.mark.parametrize("why,kw,reason", [
    ("channels-last", dict(fmt="channels_last"), "channels_last"),
    ("float16", dict(dtype=torch.float16), "float16"),
    ("7x7", dict(k=(7, 7), padding=3), None),
])
def test_depthwise_outside_the_specialised_set_runs_the_generic_kernels(why, kw, reason):
    args = dict(shape=(3, 10, 12), k=(3, 3), padding=1)
    args.update(kw)
    dtype = args.get("dtype", torch.float32)
    x, w, b, p = _dw_case(**args)
    plan, launched = _run_all(x, w, b, p, dtype)
    assert plan.algorithm == "depthwise" and "depthwise.cl" not in plan.reason
    if reason:
        assert reason in plan.reason
    assert launched.get("fwd") == 1 and not launched.get("dw_fwd"), launched


DW_CL_EDGES = [  # Note [channels-last depthwise]: (id, shape (C, *spatial), kernel, stride, padding, batch)
    ("c16-w13", (16, 9, 13), (3, 3), 1, 1, 2),
    ("c8-2x3-image-pad2", (8, 2, 3), (3, 3), 1, 2, 2),
    ("c16-stride2-pad0-w20", (16, 9, 20), (3, 3), 2, 0, 1),
    ("c8-stride2-odd-w11", (8, 7, 11), (3, 3), 2, 1, 2),
    ("c24-5x5-stride2-pad2", (24, 12, 9), (5, 5), 2, 2, 1),
    ("c8-3d-3x3x3", (8, 5, 6, 7), (3, 3, 3), 1, 1, 2),
    ("c16-3d-stride2-pad2", (16, 6, 7, 9), (3, 3, 3), 2, 2, 1),
    ("c8-w37-several-w-blocks", (8, 5, 37), (3, 3), 1, 1, 1),  # 16 W positions per CPU work-item: 16 + 16 + 5
]
CL_KERNELS = DW_KERNELS + ("dw_cl_fwd", "dw_cl_bwd_data", "dw_cl_bwd_weight")


@pytest.mark.parametrize("split", [False, True])
@pytest.mark.parametrize("dt", ["f32", "f64", "bf16"])
@pytest.mark.parametrize("edge", DW_CL_EDGES, ids=lambda e: e[0])
def test_depthwise_channels_last_kernels(edge, dt, split, monkeypatch):
    """Note [channels-last depthwise]: channels-last depthwise problems (channels in whole vectors) run dw_cl_fwd,
    dw_cl_bwd_data and dw_cl_bwd_weight (in one pass, or split over positions with dw_finalize), and match float64."""
    from portconv.backends import opencl as ob

    monkeypatch.setattr(ob, "dw_cl_splits", lambda *a: 3 if split else 1)
    _, shape, k, stride, padding, n = edge
    dtype = DTYPES[dt]
    x, w, b, p = _dw_case(shape, k, stride, padding, 1, n, dtype, fmt="channels_last")
    plan, launched = _run_all(x, w, b, p, dtype, CL_KERNELS, go_like_y=True)
    assert plan.algorithm == "depthwise" and "dw_cl_fwd" in plan.reason, plan.reason
    assert launched.get("dw_cl_fwd") == 1 and launched.get("dw_cl_bwd_data") == 1, launched
    assert not any(launched.get(kn) for kn in ("fwd", "bwd_data")), launched
    assert launched.get("dw_cl_bwd_weight") == 1 and launched.get("dw_finalize", 0) == int(split), launched
    assert not launched.get("bwd_weight"), launched


def test_depthwise_channels_last_kernels_only_where_they_apply():
    """Channel counts off the vector width (12 in float32, vectors of 8; float64's 4 divide it), a channel
    multiplier of 2, and a contiguous grad_output (its direction) keep the generic kernels."""
    for shape, mult, dtype, cl in (((12, 6, 7), 1, torch.float32, False), ((12, 6, 7), 1, torch.float64, True),
                                   ((8, 6, 7), 2, torch.float32, False)):
        x, w, b, p = _dw_case(shape, (3, 3), 1, 1, mult, 2, dtype, fmt="channels_last")
        plan, launched = _run_all(x, w, b, p, dtype, CL_KERNELS, go_like_y=True)
        assert bool(launched.get("dw_cl_fwd")) == cl and bool(launched.get("fwd")) != cl, (shape, mult, launched)
    x, w, b, p = _dw_case((16, 6, 7), (3, 3), fmt="channels_last")
    plan = opencl_plan(x, w, b, p)
    go = torch.randn(p.output_shape(x.shape, w.shape))  # contiguous (NCHW), not channels-last
    before = dict(rt.stats)
    got = plan.backward(go, x, w, (True, True, False))
    _, gi, gw, _ = reference(x, w, b, p, go)
    check(got[0], gi, torch.float32, "grad_input")
    check(got[1], gw, torch.float32, "grad_weight")
    ran = {k: rt.stats[k] - before.get(k, 0) for k in CL_KERNELS if rt.stats[k] - before.get(k, 0)}
    assert ran.get("bwd_data") == 1 and ran.get("bwd_weight") == 1 and not ran.get("dw_cl_bwd_data"), ran


def test_depthwise_channels_last_gpu_settings(monkeypatch):
    """On a GPU device the channels-last kernels build without DW_CPU (vloadn), run 8x4x4 work-groups and a grad-weight
    of 8 channel blocks x 32 position lanes (the reason says so); those settings also run, and match, on this device,
    with one split and with several (partials added by dw_finalize)."""
    from portconv.backends import opencl as ob
    from portconv.plan import clear_cache

    x, w, b, p = _dw_case((16, 9, 13), (3, 3), 1, 1, 1, 2, torch.bfloat16, fmt="channels_last")
    problem = Problem(p, spec_of(x), spec_of(w), True)
    geo = ob.geometry(problem)
    gpu = ob.dw_cl_spec(problem, geo, "channels_last", False)
    assert gpu is not None and not gpu.cpu and gpu.local == ob.DW_CL_LOCAL_GPU and "DW_CPU" not in gpu.defines
    dev = rt.info(*rt.default_index())
    reason = get("opencl").choose(problem, dataclasses.replace(dev, kind="gpu")).reason
    assert "8 channel blocks x 32 position lanes" in reason and "work-groups 8x4x4" in reason, reason
    assert "DW_CLB=8" in gpu.defines and "DW_CLR=32" in gpu.defines and "DW_CLA" not in gpu.defines
    # DW_CLA (aligned vector accesses) only where every vector starts at a multiple of 8 elements
    t = rt.DevTensor(None, 16, (2, 16, 9, 13), (16 * 9 * 13, 1, 16 * 13, 16))
    assert ob.cl_aligned(8, t) and not ob.cl_aligned(8, dataclasses.replace(t, offset=12))
    assert not ob.cl_aligned(8, dataclasses.replace(t, strides=(16 * 9 * 13, 1, 16 * 13, 20)))
    assert "DW_CLA" in dataclasses.replace(gpu, aligned=True).defines
    orig = ob.dw_cl_spec.__wrapped__
    monkeypatch.setattr(ob, "dw_cl_spec", lambda pr, g, f, cpu: orig(pr, g, f, False))
    clear_cache()
    try:
        # 16 and 72 channels (2 and 9 blocks: work-groups of 8 blocks partly past C), 2 x 5 x 7 outputs: one split;
        # 64 x 20 x 20 outputs: several splits
        for dtype, n, size, ch in ((torch.bfloat16, 2, (9, 13), 16), (torch.float32, 2, (9, 13), 72),
                                   (torch.bfloat16, 64, (40, 40), 8)):
            x, w, b, p = _dw_case((ch, *size), (3, 3), 2, 1, 1, n, dtype, fmt="channels_last")
            _, launched = _run_all(x, w, b, p, dtype, CL_KERNELS, go_like_y=True)
            assert launched.get("dw_cl_fwd") == 1 and launched.get("dw_cl_bwd_data") == 1, launched
            assert launched.get("dw_cl_bwd_weight") == 1 and not launched.get("bwd_weight"), launched
            assert launched.get("dw_finalize") == (1 if n == 64 else None), launched
    finally:
        clear_cache()


def test_depthwise_dilated_and_transposed_run_the_generic_kernels():
    x, w, b, _ = _dw_case((3, 10, 12), (3, 3))
    for p in (ConvParams.make(2, 1, 2, 2, False, 0, 3, weight_shape=w.shape),
              ConvParams.make(2, 2, 1, 1, True, 1, 3, weight_shape=w.shape)):
        plan, launched = _run_all(x, w, b, p, torch.float32)
        assert "depthwise.cl" not in plan.reason and not any(k.startswith("dw_") for k in launched), launched


def test_depthwise_w_strided_tensors_take_the_generic_kernels_per_call():
    x, w, b, p = _dw_case((3, 9, 11), (3, 3), fmt="w_strided")
    plan, launched = _run_all(x, w, b, p, torch.float32)
    assert launched.get("fwd") == 1 and launched.get("bwd_weight") == 1 and not launched.get("dw_fwd")
    assert launched.get("dw_bwd_data") == 1  # grad_output and grad_input are dense: that direction stays vectorised


@pytest.mark.parametrize("variant", ["gpu-settings", "split-reduction", "idx64"])
def test_depthwise_variants(variant, monkeypatch):
    """The GPU settings (vloadn/vstoren, 4 wide, no DW_CPU), the split grad-weight reduction with its
    finalize kernel, and the 64-bit index build, all on this device."""
    from portconv.backends import opencl as ob

    if variant == "gpu-settings":
        orig = ob.dw_spec
        monkeypatch.setattr(ob, "dw_spec", lambda pr, geo, fmt, cpu: orig(pr, geo, fmt, False))
    elif variant == "split-reduction":
        monkeypatch.setattr(ob, "dw_splits", lambda *a: 3)
    else:
        monkeypatch.setattr(rt, "force_idx64", True)
        monkeypatch.setattr(ob, "dw_splits", lambda *a: 1)  # the single-pass grad-weight in the 64-bit build
    for shape, k, stride, mult, dt in (((3, 13, 21), (3, 3), 1, 1, torch.float32),
                                       ((2, 9, 19), (3, 3), 2, 2, torch.float64),
                                       ((2, 4, 6, 11), (3, 3, 3), 1, 1, torch.float32),
                                       ((3, 9, 14), (3, 3), 2, 1, torch.bfloat16)):
        x, w, b, p = _dw_case(shape, k, stride, 1, mult, 2, dt)
        _, launched = _run_all(x, w, b, p, dt)
        assert launched.get("dw_fwd") == 1 and launched.get("dw_bwd_weight") == 1
        assert launched.get("dw_finalize", 0) == (1 if variant == "split-reduction" else 0)


def test_depthwise_gpu_work_groups_fit_the_image():
    """GPU settings: work-groups of up to 16 W blocks x 8 row blocks that fit the image, filled to 128 work-items with
    planes, at most 64 (NVIDIA's limit along z) (MobileNetV2's 7x7 and 28x28 layers), the 16x8 groups on large
    images; the CPU's up to 4x4 filled to 8."""
    from portconv.backends import opencl as ob

    for size, stride, gpu, cpu in (((7, 7), 1, (2, 4, 16), (1, 1, 8)), ((56, 56), 2, (7, 8, 2), (4, 4, 1)),
                                   ((1, 1), 1, (1, 1, 64), (1, 1, 8)),
                                   ((112, 112), 1, (16, 8, 1), (4, 4, 1)), ((56, 56), 1, (14, 8, 1), (4, 4, 1))):
        x, w, _, p = _dw_case((8, *size), (3, 3), stride)
        problem = Problem(p, spec_of(x), spec_of(w), True)
        geo = ob.geometry(problem)
        got = tuple(ob.dw_spec(problem, geo, "contiguous", c)[0].local for c in (False, True))
        assert got == (gpu, cpu), (size, stride, got)


def test_depthwise_grad_weight_is_deterministic(monkeypatch):
    from portconv.backends import opencl as ob

    x, w, b, p = _dw_case((4, 30, 45), (3, 3), n=3)
    plan = opencl_plan(x, w, b, p)
    # fixed data, like x and w: split and unsplit sums of 4050 products differ by reordering (~5e-5 absolute here,
    # within rtol of these elements); unseeded draws put such a difference on an element near 0 about 1 run in 5
    go = torch.randn(p.output_shape(x.shape, w.shape), generator=torch.Generator().manual_seed(1))
    first = plan.backward(go, x, w, (False, True, False))[1]
    assert torch.equal(first, plan.backward(go, x, w, (False, True, False))[1])
    monkeypatch.setattr(ob, "dw_splits", lambda *a: 5)
    split = plan.backward(go, x, w, (False, True, False))[1]
    assert torch.equal(split, plan.backward(go, x, w, (False, True, False))[1])
    torch.testing.assert_close(split, first, rtol=1e-5, atol=1e-5)


def test_depthwise_splits_table():
    from portconv.backends.opencl import dw_splits

    assert dw_splits(144, 392, 16, 2, cpu=True) == 1  # enough channels for two cores
    assert dw_splits(144, 98, 1, 2, cpu=True) == 1  # the CPU's one work-item per channel
    assert dw_splits(3, 40, 1, 2, cpu=True) == 3  # three channels: split for two cores (+ dw_finalize)
    assert dw_splits(144, 14 * 56 * 32, 64, 132, cpu=False) == 8  # a 132-SM GPU: 8 per SM over 144 channels
    assert dw_splits(4, 10, 64, 132, cpu=False) == 1  # too little work to split
    assert dw_splits(1, 10**7, 64, 132, cpu=False) == 64  # capped


# --- replayed launches on pyopencl arrays (Note [OpenCL replay] in portconv/backends/_cl_replay.py) ---------

def _views(q, tensors, gap=3):
    """pyopencl arrays viewing one buffer, each at its own (unaligned) element offset, like the bench's sets."""
    import numpy as np
    import pyopencl as cl
    import pyopencl.array as cla

    offsets, at = [], gap
    for t in tensors:
        offsets.append(at)
        at += t.numel() + gap
    host = np.zeros(at, np.dtype(str(tensors[0].dtype).removeprefix("torch.")))
    for t, o in zip(tensors, offsets):
        host[o:o + t.numel()] = t.contiguous().reshape(-1).numpy()
    buf = cl.Buffer(q.context, cl.mem_flags.READ_WRITE | cl.mem_flags.COPY_HOST_PTR, hostbuf=host)
    item = host.dtype.itemsize
    return [cla.Array(q, tuple(t.shape), host.dtype, data=buf, offset=o * item,
                      strides=tuple(item * s for s in t.contiguous().stride())) for t, o in zip(tensors, offsets)]


def _to_torch(a):
    from portconv.bench.data import to_torch

    return to_torch(a)


@pytest.mark.parametrize("case", [
    ("dw-3x3", (3, 13, 21), (3, 3), 1, 1, torch.float32, True),
    ("dw-s2-nobias", (2, 9, 19), (3, 3), 2, 2, torch.float64, False),
    ("dw-3d", (2, 4, 6, 11), (3, 3, 3), 1, 1, torch.float32, True),
    ("dense-generic", None, None, None, None, torch.float32, True),
    ("dense-igemm-split", 17, None, None, None, torch.float32, True),
], ids=lambda c: c[0])
def test_replayed_calls_match_the_general_path(case):
    """Second and later calls on pyopencl arrays replay the recorded launches: other offsets (views of one buffer),
    every backward mask, the same bits as the general path and the same launch counts."""
    import pyopencl as cl

    _, shape, k, stride, mult, dtype, with_bias = case
    if shape is None or type(shape) is int:
        x, w, b, p = make(CASES[6 if shape is None else shape], dtype, "contiguous")
    else:
        x, w, b, p = _dw_case(shape, k, stride, 1, mult, 2, dtype)
    b = b if with_bias else None
    dev = next(e[2] for e in rt.all_devices() if e[:2] == rt.default_index())
    q = cl.CommandQueue(cl.Context([dev]))
    go = torch.randn(p.output_shape(x.shape, w.shape), dtype=dtype)
    ry, *refs = reference(x, w, b, p, go)
    sets = [_views(q, [t for t in (x, w, b, go) if t is not None], gap=3 + i) for i in range(3)]
    for s in sets:
        if b is None:
            s.insert(2, None)
    xa, wa, ba, _ = sets[0]
    plan = portconv.plan(xa, wa, ba, stride=p.stride, padding=p.padding, dilation=p.dilation, groups=p.groups,
                         backend="opencl")
    masks = [(True, False, False), (False, True, False), (True, True, True)]
    first = None
    for i, (xa, wa, ba, ga) in enumerate(sets * 2):
        before = dict(rt.stats)
        y = plan.forward(xa, wa, ba)
        got = [plan.backward(ga, xa, wa, m) for m in masks]
        launched = {n: rt.stats[n] - before.get(n, 0) for n in rt.stats
                    if rt.stats[n] - before.get(n, 0) and n != "programs_built"}
        outs = [_to_torch(y)] + [None if o is None else _to_torch(o) for r in got for o in r]
        if first is None:
            first, first_launched = outs, launched
            assert ("opencl-replay", "fwd") in plan.state
        else:
            assert launched == first_launched, i
            for a, r in zip(outs, first):
                assert (a is None) == (r is None) and (a is None or torch.equal(a, r)), i
    check(first[0], ry, dtype, "output")
    check(first[1], refs[0], dtype, "grad_input")
    check(first[5], refs[1], dtype, "grad_weight")
    if b is not None:
        check(first[9], refs[2], dtype, "grad_bias")
    assert all(r is not None for r in plan.state[("opencl-replay", "fwd")])


def test_replay_split_reduction_poison_and_fallbacks(monkeypatch):
    """The replay of a split grad-weight (scratch + dw_finalize) under PORTCONV_POISON, and calls it does not take:
    torch tensors, other strides and forced 64-bit indices run the general path and stay correct."""
    import pyopencl as cl
    import pyopencl.array as cla

    from portconv.backends import opencl as ob

    monkeypatch.setattr(ob, "dw_splits", lambda *a: 3)
    x, w, b, p = _dw_case((3, 10, 17), (3, 3), n=2)
    dev = next(e[2] for e in rt.all_devices() if e[:2] == rt.default_index())
    q = cl.CommandQueue(cl.Context([dev]))
    go = torch.randn(p.output_shape(x.shape, w.shape))
    _, _, rgw, _ = reference(x, w, b, p, go)
    xa, wa, ba, ga = _views(q, [x, w, b, go])
    plan = portconv.plan(xa, wa, ba, stride=p.stride, padding=p.padding, groups=p.groups, backend="opencl")
    mask = (False, True, False)
    for _ in range(3):
        before = rt.stats["dw_finalize"]
        check(_to_torch(plan.backward(ga, xa, wa, mask)[1]), rgw, torch.float32, "grad_weight")
        assert rt.stats["dw_finalize"] == before + 1
    assert len(plan.state[("opencl-replay", mask)]) == 1
    # grad_output with other strides (a transposed copy viewed back): not the recorded signature
    gt = cla.to_device(q, go.transpose(2, 3).contiguous().numpy()).transpose((0, 1, 3, 2))
    check(_to_torch(plan.backward(gt, xa, wa, mask)[1]), rgw, torch.float32, "grad_weight (other strides)")
    monkeypatch.setattr(rt, "force_idx64", True)
    check(_to_torch(plan.backward(ga, xa, wa, mask)[1]), rgw, torch.float32, "grad_weight (idx64)")
    monkeypatch.setattr(rt, "force_idx64", False)
    assert len(plan.state[("opencl-replay", mask)]) <= 4  # bounded: at most MAX_REPLAYS recordings


def test_fast_path_on_pyopencl_arrays(monkeypatch):
    """Note [fast path] on pyopencl arrays: a repeated portconv.conv2d (batched or not) skips validation and planning
    and runs the same plan; bad input after a cached call still gets PyTorch's error before any kernel runs; another
    dtype gets its own entry."""
    import numpy as np
    import pyopencl as cl
    import pyopencl.array as cla

    from portconv import functional
    from portconv.plan import clear_cache

    clear_cache()
    x, w, b, p = _dw_case((4, 12, 16), (3, 3), n=2)
    dev = next(e[2] for e in rt.all_devices() if e[:2] == rt.default_index())
    q = cl.CommandQueue(cl.Context([dev]))
    xa, wa, ba = (cla.to_device(q, t.numpy()) for t in (x, w, b))
    kw = dict(padding=1, groups=4, backend="opencl")
    ref = reference(x, w, b, p, None)[0]
    first = portconv.conv2d(xa, wa, ba, **kw), portconv.conv2d(xa[0], wa, ba, **kw)
    key = functional._fast_key("conv2d", xa, wa, ba, (1, 1, 1, 4, 0), "opencl")
    assert key is not None and key in functional._fast

    def again(*a, **k):
        raise AssertionError("validated and planned again")

    with monkeypatch.context() as m:  # (undo() would also drop the autouse fixture's settings, part of the key)
        m.setattr(functional, "make_problem", again)
        m.setattr(functional, "select", again)
        for _ in range(2):
            y, y0 = portconv.conv2d(xa, wa, ba, **kw), portconv.conv2d(xa[0], wa, ba, **kw)
            check(_to_torch(y), ref, torch.float32, "cached output")
            check(_to_torch(y0), ref[0], torch.float32, "cached unbatched output")
    assert torch.equal(_to_torch(first[0]), _to_torch(y)) and torch.equal(_to_torch(first[1]), _to_torch(y0))
    ran = []
    impl = get("opencl")
    monkeypatch.setattr(type(impl), "forward", lambda *a, **k: ran.append(a))
    bad = {"channels": (x[:, :3].contiguous(), w, b), "bias dtype": (x, w, b.double()),
           "input dtype, same strides": (x.int(), w, b)}
    for what, ts in bad.items():
        with pytest.raises(RuntimeError) as want:
            F.conv2d(*ts, padding=1, groups=4)
        arrays = [cla.to_device(q, t.numpy()) for t in ts]
        for _ in range(2):  # never cached: checked again each time
            with pytest.raises(RuntimeError) as got:
                portconv.conv2d(*arrays, **kw)
            assert str(got.value) == str(want.value), what
    assert ran == []  # the checks came before any kernel
    assert functional._fast_key("conv2d", xa.astype(np.float64), wa, ba, (1, 1, 1, 4, 0), "opencl") != key
    assert functional._fast_key("conv2d", xa, wa, ba, (1.0, 1, 1, 4, 0), "opencl") is None


def test_replay_waits_for_the_arrays_events():
    """An input written by a command still queued on another queue: the replayed launch waits for its event."""
    import numpy as np
    import pyopencl as cl
    import pyopencl.array as cla

    x, w, b, p = _dw_case((4, 12, 16), (3, 3), n=1)
    dev = next(e[2] for e in rt.all_devices() if e[:2] == rt.default_index())
    ctx = cl.Context([dev])
    q1, q2 = cl.CommandQueue(ctx), cl.CommandQueue(ctx)
    xa, wa, ba = (cla.to_device(q1, t.numpy()) for t in (x, w, b))
    plan = portconv.plan(xa, wa, ba, stride=1, padding=1, groups=4, backend="opencl")
    plan.forward(xa, wa, ba)
    q1.finish()
    x2 = torch.randn(x.shape)
    xb = cla.empty(q2, x.shape, np.float32)
    gate = cl.UserEvent(ctx)
    xb.add_event(cl.enqueue_copy(q2, xb.base_data, x2.numpy(), wait_for=[gate], is_blocking=False))
    xb = xb.with_queue(q1)
    y = plan.forward(xb, wa, ba)
    gate.set_status(cl.command_execution_status.COMPLETE)
    check(_to_torch(y), reference(x2, w, b, p, None)[0], torch.float32, "output after the copy")


# --- the implicit-GEMM kernels (opencl/igemm.cl, Note [OpenCL implicit GEMM]) -------------------------------

IG_KERNELS = ("ig_fwd", "ig_bwd_data", "ig_bwd_weight", "ig_finalize", "fwd", "bwd_data", "bwd_weight")


def _ig_case(n, cin, cout, sp, k, stride=1, padding=0, dilation=1, groups=1, transposed=False, out_pad=0,
             dtype=torch.float32, fmt="contiguous", seed=0):
    case = ("ig", len(sp), n, cin, cout, sp, k, stride, padding, dilation, groups, transposed, out_pad)
    return make(case, dtype, fmt, seed=seed)


def _ig_run(x, w, b, p, dtype):
    return _run_all(x, w, b, p, dtype, IG_KERNELS)


@pytest.fixture
def dense_mode(monkeypatch):
    """Set PORTCONV_OPENCL_DENSE for one test (the plan cache cleared before and after)."""
    from portconv.plan import clear_cache

    def set_mode(mode):
        monkeypatch.setenv("PORTCONV_OPENCL_DENSE", mode)
        clear_cache()

    yield set_mode
    monkeypatch.delenv("PORTCONV_OPENCL_DENSE", raising=False)
    clear_cache()


IG_EDGES = [  # (id, kwargs of _ig_case): M, N and the reduction off the 64 x 64 x 16 tile, groups, strides, layouts
    ("m-n-red-off-tile", dict(n=3, cin=5, cout=67, sp=(11, 13), k=(3, 3), padding=1)),
    ("wide-n-130", dict(n=1, cin=17, cout=130, sp=(9, 7), k=(1, 1))),
    ("groups4-stride2", dict(n=2, cin=12, cout=20, sp=(15, 14), k=(3, 3), stride=2, padding=1, groups=4)),
    ("stride2-bwd-data-odd", dict(n=2, cin=6, cout=9, sp=(17, 16), k=(3, 3), stride=2, padding=0)),
    ("stride3-k2-phases-no-tap", dict(n=1, cin=4, cout=5, sp=(13, 11), k=(2, 2), stride=3, padding=1)),
    ("dilated-stride1", dict(n=2, cin=7, cout=6, sp=(12, 12), k=(3, 3), padding=2, dilation=2)),
    ("stride2-dilated-direct-bwd", dict(n=2, cin=4, cout=6, sp=(13, 12), k=(3, 3), stride=2, padding=2, dilation=2)),
    ("channels-last", dict(n=2, cin=9, cout=70, sp=(10, 9), k=(3, 3), stride=2, padding=1, fmt="channels_last")),
    ("3d", dict(n=2, cin=5, cout=7, sp=(6, 7, 5), k=(3, 3, 3), stride=(1, 2, 1), padding=1)),
    ("3d-channels-last-groups", dict(n=1, cin=6, cout=6, sp=(5, 6, 7), k=(2, 3, 3), padding=1, groups=2,
                                     fmt="channels_last")),
    ("1d", dict(n=3, cin=7, cout=9, sp=(53,), k=(5,), stride=2, padding=2)),
    ("1d-long-kernel-groups", dict(n=2, cin=8, cout=8, sp=(40,), k=(17,), padding=8, groups=2)),
    ("transposed-s2-outpad", dict(n=2, cin=6, cout=5, sp=(7, 6), k=(4, 4), stride=2, padding=1, transposed=True,
                                  out_pad=1)),
    ("transposed-groups-3d", dict(n=1, cin=4, cout=6, sp=(3, 4, 3), k=(3, 3, 3), stride=2, padding=1, groups=2,
                                  transposed=True, out_pad=1)),
    ("split-grad-weight", dict(n=3, cin=3, cout=5, sp=(33, 31), k=(3, 3), padding=1)),
    ("single-input-channel", dict(n=2, cin=1, cout=8, sp=(21, 40), k=(5, 7), stride=2)),
    ("narrow-groups8", dict(n=2, cin=32, cout=24, sp=(11, 10), k=(3, 3), stride=2, padding=1, groups=8)),
    ("narrow-rows-split", dict(n=4, cin=40, cout=6, sp=(30, 29), k=(1, 1))),
]


def _edge(name):
    return dict(next(e[1] for e in IG_EDGES if e[0] == name))


# every shape in float32 and float64; float16 and bfloat16 on a spread of them (the conformance grid runs them all)
IG_PARAMS = [pytest.param(e, dt, id=f"{e[0]}-{dt}") for e in IG_EDGES for dt in ("f32", "f64")
             + (("f16", "bf16") if e[0] in ("m-n-red-off-tile", "channels-last", "transposed-s2-outpad", "1d") else ())]


@pytest.mark.parametrize("edge,dt", IG_PARAMS)
def test_igemm_edge_shapes(edge, dt, dense_mode):
    dense_mode("igemm")
    dtype = DTYPES[dt]
    kw = dict(edge[1])
    x, w, b, p = _ig_case(dtype=dtype, **kw)
    plan, launched = _ig_run(x, w, b, p, dtype)
    assert plan.algorithm == _igemm_alg(plan) + ("-transposed" if p.transposed else "")
    data_fwd, data_bwd = ("ig_bwd_data", "ig_fwd") if p.transposed else ("ig_fwd", "ig_bwd_data")
    assert launched.get(data_fwd) == 1 and launched.get("ig_bwd_weight") == 1
    if edge[0] == "stride2-dilated-direct-bwd":  # no phase decomposition: the direct kernel
        assert launched.get("bwd_data") == 1 and not launched.get(data_bwd)
        assert "the direct kernel" in plan.reason
    else:
        assert launched.get(data_bwd) == 1 and not launched.get("bwd_data") and not launched.get("fwd")
    if edge[0] == "split-grad-weight":
        assert launched.get("ig_finalize") == 1


@pytest.mark.parametrize("tile", [(64, 64, 16, 4, 4), (32, 64, 8, 4, 8), (64, 32, 16, 8, 4), (16, 16, 8, 2, 2),
                                  (128, 64, 16, 8, 4), (128, 128, 8, 8, 8)],
                         ids=lambda t: "x".join(map(str, t)))
def test_igemm_tile_configurations(tile, dense_mode, monkeypatch):
    """Other tile shapes than the default (the GPU and CPU defaults are tables, not fixed by the kernels)."""
    from portconv.backends import _cl_igemm

    dense_mode("igemm")
    monkeypatch.setattr(_cl_igemm, "CPU_TILE", _cl_igemm.IgSpec(*tile, cpu=True))
    monkeypatch.setattr(_cl_igemm, "GPU_TILE", _cl_igemm.IgSpec(*tile))
    for name in ("m-n-red-off-tile", "groups4-stride2", "transposed-s2-outpad", "split-grad-weight", "channels-last"):
        x, w, b, p = _ig_case(**_edge(name))
        _ig_run(x, w, b, p, torch.float32)


def test_igemm_gpu_settings_idx64_and_determinism(dense_mode, monkeypatch):
    """The GPU build (no IG_CPU), the 64-bit index build, and bit-identical split grad-weights across calls."""
    from portconv.backends import _cl_igemm

    dense_mode("igemm")
    monkeypatch.setattr(_cl_igemm, "CPU_TILE", _cl_igemm.GPU_TILE)
    x, w, b, p = _ig_case(**_edge("split-grad-weight"))
    plan, launched = _ig_run(x, w, b, p, torch.float32)
    assert launched.get("ig_finalize") == 1
    go = torch.randn(p.output_shape(x.shape, w.shape), generator=torch.Generator().manual_seed(2))
    first = plan.backward(go, x, w, (True, True, False))
    assert all(torch.equal(a, c) for a, c in zip(first[:2], plan.backward(go, x, w, (True, True, False))[:2]))
    monkeypatch.setattr(rt, "force_idx64", True)
    for name in ("split-grad-weight", "transposed-groups-3d", "channels-last", "narrow-groups8", "narrow-rows-split"):
        x, w, b, p = _ig_case(**_edge(name))
        _ig_run(x, w, b, p, torch.float32)


def test_igemm_selection_table(dense_mode):
    """Which algorithm a problem gets per device kind and PORTCONV_OPENCL_DENSE, with the reason."""
    from portconv.backends import _cl_igemm

    backend = get("opencl")
    x, w, b, p = _ig_case(n=1, cin=4, cout=8, sp=(9, 9), k=(3, 3), padding=1)
    xd, wd, bd, pd = _dw_case((4, 9, 9), (3, 3))
    xt, wt, bt, pt = _ig_case(n=1, cin=4, cout=8, sp=(5, 5), k=(3, 3), stride=2, padding=1, transposed=True)
    xs, ws, bs, ps = _ig_case(n=1, cin=4, cout=8, sp=(9, 9), k=(3, 3), stride=2, padding=2, dilation=2)
    dev = rt.info(*rt.default_index())

    def alg(x, w, b, p, kind):
        choice = backend.choose(Problem(p, spec_of(x), spec_of(w), b is not None), dataclasses.replace(dev, kind=kind))
        return choice.algorithm, choice.reason

    gpu_dense = "igemm-tc" if _cl_igemm.tc_mode("float32", dataclasses.replace(dev, kind="gpu"))[0] else "igemm"
    for mode, kind, dense, transposed in (
            (None, "gpu", gpu_dense, gpu_dense + "-transposed"),
            (None, "cpu", _cl_igemm.DENSE_CPU_DEFAULT, _cl_igemm.DENSE_CPU_DEFAULT + "-transposed"),
            ("direct", "gpu", "direct", "direct-transposed"),
            ("igemm", "cpu", "igemm", "igemm-transposed")):
        if mode:
            dense_mode(mode)
        assert alg(x, w, b, p, kind)[0] == dense, (mode, kind)
        assert alg(xt, wt, bt, pt, kind)[0] == transposed, (mode, kind)
        assert alg(xd, wd, bd, pd, kind)[0] == "depthwise", (mode, kind)  # the depthwise rule is unchanged
    dense_mode("igemm")
    assert "by phases (4 phase(s)" in alg(x, w, b, dataclasses.replace(p, stride=(2, 2)), "gpu")[1]
    assert "the direct kernel" in alg(xs, ws, bs, ps, "gpu")[1]
    assert "PORTCONV_OPENCL_DENSE=igemm" in alg(x, w, b, p, "cpu")[1]


@pytest.mark.parametrize("case", [c for c in CASES if "depthwise" not in c[0]][::2], ids=lambda c: c[0])
def test_forced_direct_kernels(case, dense_mode):
    """PORTCONV_OPENCL_DENSE=direct keeps the direct kernels of conv.cl for dense problems."""
    dense_mode("direct")
    x, w, b, p = make(case, torch.float32, "contiguous")
    plan, launched = _ig_run(x, w, b, p, torch.float32)
    assert plan.algorithm == "direct" + ("-transposed" if p.transposed else "")
    assert not any(k.startswith("ig_") for k in launched) and launched.get("bwd_weight") == 1


def test_dense_knob_is_part_of_the_plan_key(monkeypatch):
    """Changing PORTCONV_OPENCL_DENSE mid-process makes a new plan (the knob is in the plan cache's key)."""
    x, w, b, p = make(CASES[0], torch.float32, "contiguous")
    assert "depthwise" not in CASES[0][0]
    algs = []
    for mode in ("direct", "igemm", "direct"):
        monkeypatch.setenv("PORTCONV_OPENCL_DENSE", mode)
        algs.append(opencl_plan(x, w, b, p).algorithm.split("-")[0])  # select(): the cached path
    assert algs == ["direct", "igemm", "direct"]


def test_igemm_splits_table():
    from portconv.backends._cl_igemm import GPU_TILE, splits
    from portconv.backends.opencl import Geometry

    def geo(n, c, k, y, taps=(3, 3), g=1):
        return Geometry(n, g, c, k, (1, *y), (1, *y), (1, *taps), (1, 1, 1), (0, 1, 1), (1, 1, 1))

    assert splits(geo(32, 64, 64, (56, 56)), GPU_TILE, 132, 4) == (59, 1712)  # 9 tiles: 528 groups wanted
    assert splits(geo(32, 256, 256, (14, 14)), GPU_TILE, 132, 4) == (4, 1568)  # 144 tiles
    assert splits(geo(1, 64, 64, (56, 56)), GPU_TILE, 132, 4) == (12, 272)  # >= 16 steps of 16 per split
    assert splits(geo(1, 4, 4, (5, 5)), GPU_TILE, 132, 4) == (1, 32)  # too short to split
    assert splits(geo(32, 2048, 2048, (14, 14)), GPU_TILE, 132, 4)[0] == 1  # 9216 tiles fill the GPU
    assert splits(geo(32, 512, 512, (28, 28)), GPU_TILE, 2, 4) == (1, 25088)  # 2-core CPU: the tiles suffice


def test_igemm_narrow_tiles():
    """GEMMs with few columns or rows per group (resnext50-g32: 4 channels per group) run a tile narrow on that side."""
    from portconv.backends._cl_igemm import CPU_TILE, GPU_TILE, NARROW_TILES, fit

    assert fit(GPU_TILE, 100352, 256) == GPU_TILE
    assert fit(GPU_TILE, 100352, 4) == NARROW_TILES[(False, "cols", 16)]  # forward, 4 output channels per group
    assert fit(GPU_TILE, 4, 36) == NARROW_TILES[(False, "rows", 16)]  # grad-weight, 4 output channels per group
    assert fit(CPU_TILE, 3136, 16) == NARROW_TILES[(True, "cols", 16)]
    assert fit(CPU_TILE, 3136, 4) == NARROW_TILES[(True, "cols", 4)]
    assert fit(CPU_TILE, 8, 8) == NARROW_TILES[(True, "rows", 16)]
    assert fit(CPU_TILE, 3, 36) == NARROW_TILES[(True, "rows", 4)]
    assert fit(NARROW_TILES[(True, "cols", 4)], 3136, 4) == NARROW_TILES[(True, "cols", 4)]
    assert fit(GPU_TILE, 17, 17) == GPU_TILE
    from portconv.backends._cl_igemm import TC_TILE

    def shape(sp):
        return sp.bm, sp.bn, sp.wm, sp.wn, sp.threads, sp.tc

    assert fit(TC_TILE, 100352, 256) == TC_TILE
    assert shape(fit(TC_TILE, 100352, 3)) == (128, 8, 4, 1, 128, "ptx")  # the stem's backward-data
    assert shape(fit(TC_TILE, 100352, 12)) == (128, 16, 4, 1, 128, "ptx")
    assert shape(fit(TC_TILE, 4, 36)) == (16, 128, 1, 4, 128, "ptx")  # grad-weight, 4 output channels per group
    assert fit(TC_TILE, 100352, 17) == TC_TILE
    from portconv.backends._cl_igemm import weight_tile

    assert shape(weight_tile(TC_TILE)) == (128, 128, 2, 4, 256, "ptx") and weight_tile(TC_TILE).bk == 32
    assert shape(fit(weight_tile(TC_TILE), 4, 36)) == (16, 128, 1, 4, 128, "ptx")
    for rows, want in ((17, (64, 128, 2, 4, 256, "ptx")), (64, (64, 128, 2, 4, 256, "ptx")),
                       (65, (128, 128, 2, 4, 256, "ptx")), (16, (16, 128, 1, 4, 128, "ptx"))):
        assert shape(fit(weight_tile(TC_TILE, rows), rows, 576)) == want, rows
    assert weight_tile(GPU_TILE) == GPU_TILE


def test_igemm_tile_too_large_for_the_device_runs_the_direct_kernels(dense_mode, monkeypatch):
    """A device whose kernel work-group limit is below the tile's work-items runs the direct kernels instead."""
    dense_mode("igemm")
    orig = rt.Runtime.ig_kernel
    monkeypatch.setattr(rt.Runtime, "ig_kernel", lambda self, *a: (orig(self, *a)[0], 8))
    x, w, b, p = _ig_case(**_edge("m-n-red-off-tile"))
    plan, launched = _ig_run(x, w, b, p, torch.float32)
    assert plan.algorithm == _igemm_alg(plan)
    assert launched == {"fwd": 1, "bwd_data": 1, "bwd_weight": 1}


# --- the tensor-core tile (opencl/igemm_tc.h, Note [OpenCL tensor cores]) ------------------------------------------


@pytest.fixture
def tc_tile(monkeypatch, dense_mode):
    """PORTCONV_OPENCL_TC for one test: 'ptx' on an NVIDIA GPU of sm_80+ (the mma.sync products), else 'portable'
    (the same tile, products in plain OpenCL C: PoCL in CI). Returns the mode."""
    from portconv.backends import _cl_igemm

    dev = rt.info(*rt.default_index())
    monkeypatch.setenv("PORTCONV_OPENCL_TC", "")
    mode = "ptx" if _cl_igemm.tc_mode("float16", dev)[0] == "ptx" else "portable"
    monkeypatch.setenv("PORTCONV_OPENCL_TC", mode)
    dense_mode("igemm")
    return mode


TC_EDGES = [  # every direction on the tile: > 16 channels on both sides of each GEMM (narrower ones run FMA tiles)
    ("tc-3x3-stride2-phases", dict(n=2, cin=24, cout=40, sp=(10, 9), k=(3, 3), stride=2, padding=1)),
    ("tc-1x1-wide", dict(n=1, cin=17, cout=130, sp=(9, 7), k=(1, 1))),
    ("tc-split-channels-last", dict(n=4, cin=20, cout=36, sp=(33, 31), k=(3, 3), padding=1, fmt="channels_last")),
    ("tc-3d-transposed", dict(n=2, cin=24, cout=20, sp=(4, 5, 4), k=(3, 3, 3), stride=2, padding=1, transposed=True,
                              out_pad=1)),
    ("tc-1d-dilated-groups", dict(n=3, cin=40, cout=48, sp=(40,), k=(5,), padding=4, dilation=2, groups=2)),
    # Note [OpenCL M-lane gathers]: NCHW backward-data with phases 19 and 18 wide loads along the rows
    ("tc-mlane-stride2", dict(n=2, cin=24, cout=40, sp=(9, 37), k=(3, 3), stride=2, padding=1)),
    # narrow tensor-core tiles (TC_NARROW): backward-data of 3 input channels (128x8), 4 channels per group (128x8
    # forward and backward-data, 16x128 grad-weight), 12 output channels (128x16 forward)
    ("tc-narrow-cin3", dict(n=2, cin=3, cout=24, sp=(15, 14), k=(5, 5), stride=2, padding=2)),
    ("tc-narrow-groups4", dict(n=2, cin=16, cout=16, sp=(9, 9), k=(3, 3), padding=1, groups=4)),
    ("tc-narrow-cout12", dict(n=2, cin=20, cout=12, sp=(11, 10), k=(3, 3), padding=1)),
]
TC_PARAMS = [pytest.param(e, dt, id=f"{e[0]}-{dt}") for e in TC_EDGES for dt in ("f32", "f16", "bf16")
             if dt == "f32" or e[0] in ("tc-3x3-stride2-phases", "tc-split-channels-last", "tc-3d-transposed",
                                        "tc-narrow-groups4", "tc-mlane-stride2")]


@pytest.mark.parametrize("edge,dt", TC_PARAMS)
def test_igemm_tensor_core_tile(edge, dt, tc_tile):
    """Forward and every gradient on the tensor-core tile match float64 within the plan's math (TF32 for float32;
    16-bit operands are exact in the tile); the split grad-weight adds its partials; the reason names the tile."""
    dtype = DTYPES[dt]
    x, w, b, p = _ig_case(dtype=dtype, **edge[1])
    plan, launched = _ig_run(x, w, b, p, dtype)
    assert plan.algorithm == "igemm-tc" + ("-transposed" if p.transposed else "")
    assert plan.math == ("tf32" if dt == "f32" else "fp32-accumulate")
    assert "tensor-core tiles" in plan.reason and f"PORTCONV_OPENCL_TC={tc_tile}" in plan.reason
    assert ("M-lane" in plan.reason) == (edge[0] in ("tc-mlane-stride2", "tc-1d-dilated-groups")), plan.reason
    assert launched.get("ig_fwd") == 1 and launched.get("ig_bwd_data") == 1 and launched.get("ig_bwd_weight") == 1
    assert not {"fwd", "bwd_data", "bwd_weight"} & set(launched)
    if edge[0] == "tc-split-channels-last":
        assert launched.get("ig_finalize") == 1


# Note [OpenCL tap-major steps]: channel counts per group that are multiples of the tile's reduction step 16 (forward
# C/G, backward-data K/G), with a phase of no tap (stride 3, kernel 2), 3-D, groups, and M-lane loads (wide phases)
TM_EDGES = [
    ("tm-3x3-stride2", dict(n=2, cin=32, cout=48, sp=(11, 37), k=(3, 3), stride=2, padding=1)),
    ("tm-stride3-no-tap", dict(n=2, cin=16, cout=32, sp=(13, 11), k=(2, 2), stride=3, padding=1)),
    ("tm-3d-groups", dict(n=2, cin=64, cout=32, sp=(4, 5, 6), k=(3, 3, 3), padding=1, groups=2)),
    ("tm-1x1-transposed", dict(n=2, cin=16, cout=32, sp=(9, 20), k=(1, 1), transposed=True)),
]


TM_PARAMS = [pytest.param(e, dt, fmt, id=f"{e[0]}-{dt}-{fmt}") for e in TM_EDGES for dt in ("f32", "bf16")
             for fmt in ("contiguous", "channels_last") if fmt == "contiguous" or len(e[1]["sp"]) == 2]


@pytest.mark.parametrize("edge,dt,layout", TM_PARAMS)
def test_igemm_tensor_core_tap_major(edge, dt, layout, tc_tile, monkeypatch):
    """Note [OpenCL tap-major steps] on the tensor-core tile, forced for every layout (the default takes channels-last
    problems): forward and backward-data step channel-innermost without divisions, rows' bounds once per tap; every
    result matches float64 within the plan's math."""
    from portconv.backends import _cl_igemm
    from portconv.plan import clear_cache

    dtype = DTYPES[dt]
    from portconv.backends import opencl as ob

    x, w, b, p = _ig_case(dtype=dtype, fmt=layout, **edge[1])
    geo = ob.geometry(Problem(p, spec_of(x), spec_of(w), True))
    for direction, ch in (("fwd", geo.CX), ("bwd_data", geo.CY)):
        assert ch % _cl_igemm.TC_TILE.bk == 0 and _cl_igemm.gather_order(direction, geo, True, 16)[1]
    built = []
    orig, order = _cl_igemm._kernel, _cl_igemm.gather_order

    def spy(call, name, desc, tensors, sp, *a):
        built.append((name, sp.tapmajor, desc.c_inner, sp.mfast))
        return orig(call, name, desc, tensors, sp, *a)

    monkeypatch.setattr(_cl_igemm, "gather_order", lambda k, g, c_inner, bk: (order(k, g, c_inner, bk)[0], True))
    monkeypatch.setattr(_cl_igemm, "_kernel", spy)
    clear_cache()
    plan, launched = _ig_run(x, w, b, p, dtype)
    assert plan.algorithm.startswith("igemm-tc") and launched.get("ig_fwd") == 1 and launched.get("ig_bwd_data") == 1
    assert {(n, t, c) for n, t, c, _ in built if n != "bwd_weight"} == {("fwd", True, 1), ("bwd_data", True, 1)}, built
    if layout == "contiguous" and edge[0] in ("tm-3x3-stride2", "tm-1x1-transposed"):  # with M-lane loads too
        assert any(mf for n, _, _, mf in built if n == ("bwd_data" if edge[0] == "tm-3x3-stride2" else "fwd")), built


def test_igemm_gather_order():
    """The tensor-core tile's load order per kernel (M-lane loads, tap-major steps) on the suite's rows: the rule the
    H100 measurements chose (_cl_igemm's notes)."""
    from portconv.backends import _cl_igemm
    from portconv.backends import opencl as ob
    from portconv.bench import load_suite

    rows = {r.name: r for r in load_suite(None)[0]}
    want = {  # row: ((fwd kernel mlane, tap-major), (bwd_data kernel mlane, tap-major))
        "resnet50-stem": ((False, False), (True, True)),  # C_in 3 (no tap-major forward); 4 phases of 16 taps
        "resnet50-l1-3x3": ((False, False), (True, True)),
        "resnet50-l1-3x3-bf16-cl": ((False, True), (False, True)),
        "resnet50-l3-3x3": ((False, False), (False, False)),  # 14-wide phases
        "resnet50-1x1-expand": ((True, True), (True, True)),
        "resnet50-1x1-reduce": ((False, True), (False, True)),
        "r3d18-l1-3d": ((False, False), (True, False)),  # depth taps
        "wav2vec2-posconv-g16": ((False, False), (False, False)),
        "vae-dec-transposed-bf16": ((False, False), (True, True)),  # forward = the bwd_data kernel
        "dcgan-gen-transposed": ((False, False), (False, False)),
    }
    for name, (f, bd) in want.items():
        c = rows[name].case
        x = torch.empty((1, *c.input_shape[1:]), device="meta")
        w = torch.empty(c.weight_shape, device="meta")
        geo = ob.geometry(Problem(c.params, spec_of(x), spec_of(w), True))
        cl = c.layout == "chlast"
        got = (_cl_igemm.gather_order("fwd", geo, cl, 16), _cl_igemm.gather_order("bwd_data", geo, cl, 16))
        assert got == (f, bd), (name, got)


def _tf32_rna(v: torch.Tensor) -> torch.Tensor:
    """float32 -> TF32 (10 mantissa bits), to nearest with ties away from zero (PTX cvt.rna.tf32.f32)."""
    bits = v.view(torch.int32).to(torch.int64) & 0xFFFFFFFF
    out = ((bits + 0x1000) & 0xFFFFE000).to(torch.int32)  # sign-magnitude: the add rounds the magnitude
    return torch.where(torch.isfinite(v), out.view(torch.float32), v)


def test_igemm_tensor_core_tf32_rounding(tc_tile):
    """TF32 operands are rounded to nearest, ties away from zero, once, before the products: a 1x1 convolution with
    one input channel gives y = tf32(x) * tf32(w) exactly; infinities stay infinite and NaN stays NaN."""
    ulp = 2.0**-10
    vals = [1 + ulp / 2, 1 + 3 * ulp / 2, -(1 + ulp / 2), 1 + ulp / 2 - 2.0**-20, 3 + 0.7 * ulp, 1e-30, -2.5e20,
            float("inf"), -float("inf"), float("nan"), 0.0, -0.0, 1 + ulp / 2 + 2.0**-23]
    x = torch.tensor(vals * 5, dtype=torch.float32)[:64].reshape(1, 1, 4, 16)
    w = torch.tensor([1.0, -1.0, 0.5, 1 + ulp / 2] * 8, dtype=torch.float32).reshape(32, 1, 1, 1)
    p = ConvParams.make(2, 1, 0, 1)
    plan = opencl_plan(x, w, None, p)
    assert plan.algorithm == "igemm-tc" and plan.math == "tf32"
    y = plan.forward(x, w, None)
    want = (_tf32_rna(x).double() * _tf32_rna(w).double().reshape(1, 32, 1, 1)).float()
    assert torch.equal(torch.isnan(y), torch.isnan(want)), "NaN positions differ"
    ok = ~torch.isnan(want)
    assert torch.equal(y[ok], want[ok]), (y[ok] - want[ok]).abs().max()


def test_igemm_tensor_core_selection(monkeypatch):
    """Where the tile runs by default: NVIDIA GPUs of sm_80+, float16/bfloat16 always, float32 where torch allows TF32
    for cuDNN convolutions; never float64, older GPUs or other vendors; the knob forces either way."""
    from portconv.backends import _cl_igemm
    from portconv.device import DeviceInfo

    h100 = DeviceInfo(vendor="nvidia", kind="gpu", name="H100", arch="sm_90", runtime="opencl")
    t4 = dataclasses.replace(h100, name="T4", arch="sm_75")
    amd = DeviceInfo(vendor="amd", kind="gpu", name="MI250", arch="gfx90a", runtime="opencl")
    pocl = DeviceInfo(vendor="pocl", kind="cpu", name="cpu", arch="x86_64", runtime="opencl")
    monkeypatch.delenv("PORTCONV_OPENCL_TC")
    conv = getattr(torch.backends.cudnn, "conv", None)
    old = conv.fp32_precision if conv is not None else torch.backends.cudnn.allow_tf32
    try:
        assert _cl_igemm.tc_mode("float16", h100)[0] == "ptx" and _cl_igemm.tc_mode("bfloat16", h100)[0] == "ptx"
        if conv is not None:
            conv.fp32_precision = "tf32"
        else:
            torch.backends.cudnn.allow_tf32 = True
        assert _cl_igemm.tc_mode("float32", h100)[0] == "ptx"
        if conv is not None:
            conv.fp32_precision = "ieee"
        else:
            torch.backends.cudnn.allow_tf32 = False
        mode, why = _cl_igemm.tc_mode("float32", h100)
        assert mode == "" and "TF32 not allowed" in why
    finally:
        if conv is not None:
            conv.fp32_precision = old
        else:
            torch.backends.cudnn.allow_tf32 = old
    for dev in (t4, amd, pocl):
        mode, why = _cl_igemm.tc_mode("float16", dev)
        assert mode == "" and "sm_80" in why, dev
    assert _cl_igemm.tc_mode("float64", h100)[0] == ""
    for forced in ("portable", "ptx"):
        monkeypatch.setenv("PORTCONV_OPENCL_TC", forced)
        assert _cl_igemm.tc_mode("float32", pocl)[0] == forced
    monkeypatch.setenv("PORTCONV_OPENCL_TC", "off")
    assert _cl_igemm.tc_mode("float16", h100)[0] == ""
