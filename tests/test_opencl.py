"""The opencl backend against PyTorch in float64: every direction, dtype, layout and tensor type it takes."""
from __future__ import annotations

import ast
import dataclasses
import pathlib
import sys

import pytest
import torch
import torch.nn.functional as F
from opencl_cases import (
    CASES,
    CL_FMT,
    DTYPES,
    NO_TC,
    check,
    dw_case,
    launched_since,
    make,
    opencl_plan,
    problem_of,
    reference,
    this_device,
    tol,
)

import portconv
from portconv import knobs
from portconv.backends import get
from portconv.backends.opencl import runtime as rt
from portconv.backends.program import Buffer, KernelPlan, Program
from portconv.errors import Unsupported
from portconv.knobs import Options
from portconv.params import ConvParams
from portconv.rules import TorchContext, result_format
from portconv.tensors import TensorSpec, spec_of

pytestmark = pytest.mark.usefixtures("opencl_env")


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
    want = result_format(plan.problem, "cpu", TorchContext.from_torch("cpu"))[0]  # Note [own kernels' result layout]
    assert plan.memory_format == want
    if want != "contiguous":
        mf = CL_FMT[p.rank]
        assert y.is_contiguous(memory_format=mf) and gi.is_contiguous(memory_format=mf)
        assert gw.is_contiguous(memory_format=mf)
    else:
        assert y.is_contiguous() and gi.is_contiguous() and gw.is_contiguous()
    expect_alg = "depthwise" if case[0].endswith(("depthwise-m1", "depthwise-m2", "transposed-depthwise")) \
        else "igemm"  # Note [OpenCL dense algorithm]: the default on every device kind (tensor cores off here)
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


def _device():
    return next(e[2] for e in rt.all_devices() if e[:2] == rt.default_index())


def test_pyopencl_arrays_in_and_out():
    cl = pytest.importorskip("pyopencl")  # present whenever the backend is available
    import numpy as np
    import pyopencl.array as cla

    ctx = cl.Context([_device()])
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
        assert plan.memory_format == fmt and plan.device.index.startswith("opencl:")  # cuDNN's rule for arrays
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


def test_idx64_variant_and_determinism():
    """Options(index64=True): every launch of the plan is the 64-bit index build, and matches float64; reductions
    give the same bits on every call."""
    x, w, b, p = make(CASES[18], torch.float32, "noncontig")
    plan = opencl_plan(x, w, b, p)
    go = torch.randn(p.output_shape(x.shape, w.shape))
    first = plan.backward(go, x, w, (True, True, True))
    again = plan.backward(go, x, w, (True, True, True))
    assert all(torch.equal(a, b_) for a, b_ in zip(first, again)), "reductions are not deterministic"
    assert not any(("IDX64", "") in x_.module.defines for k in plan.kernels for x_ in k.launches)
    with portconv.options(index64=True):
        plan = opencl_plan(x, w, b, p)
    assert all(("IDX64", "") in x_.module.defines for k in plan.kernels for x_ in k.launches)
    assert all("64-bit indices" in line for k in plan.kernels for line in k.decisions if " grid " in line)
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
    """Under PORTCONV_POISON results start as NaN: the runtime's fill for every dtype, and a loaded program whose
    result no launch writes returns NaN (torch tensors and pyopencl arrays)."""
    import pyopencl as cl
    import pyopencl.array as cla

    from portconv.backends.opencl.launch import Loader

    runtime = rt.runtime_for_index(this_device().index)
    for dtype in ("float32", "float64", "float16", "bfloat16"):
        buf = runtime.allocate(6 * rt.ITEMSIZE[dtype])
        runtime.poison(runtime.queue, buf, dtype, 6)
        assert torch.isnan(runtime.download(buf, (2, 3), (3, 1), dtype, runtime.queue)).all(), dtype
    x, w, b, p = make(CASES[5], torch.float32, "contiguous")
    problem = problem_of(x, w, None, p)
    impl = get("opencl")
    device = impl.device_for(problem)
    loader = Loader(problem, device, NO_TC, impl.choose(problem, device, NO_TC))
    shape = problem.output_shape
    out = Buffer("output", shape, (shape[1] * shape[2] * shape[3], shape[2] * shape[3], shape[3], 1), "float32", True)
    prog = Program.of((KernelPlan("output", "no launch", (), (out,), ()),), ("output",))
    for anchor in (x, cla.to_device(cl.CommandQueue(cl.Context([_device()])), x.numpy())):
        got = loader.load(prog, anchor)({"input": anchor, "weight": w, "bias": None})[0]
        got = got if isinstance(got, torch.Tensor) else torch.from_numpy(got.get())
        assert got.shape == shape and torch.isnan(got).all()


def test_unsupported_reasons():
    impl = get("opencl")
    p = ConvParams.make(2, 1, 0, 1)
    cuda = TensorSpec((1, 2, 4, 4), (32, 16, 4, 1), "float32", "cuda", 0)
    with pytest.raises(Unsupported, match="takes CPU tensors or pyopencl arrays"):
        impl.device_for(problem_of_specs(p, cuda, dataclasses.replace(cuda, shape=(3, 2, 3, 3), strides=(18, 9, 3, 1))))
    x, w = spec_of(torch.zeros(1, 2, 4, 4)), spec_of(torch.zeros(3, 2, 3, 3))
    device = impl.device_for(problem_of_specs(p, x, w))
    ints = problem_of_specs(p, dataclasses.replace(x, dtype="int32"), dataclasses.replace(w, dtype="int32"))
    with pytest.raises(Unsupported, match="not int32"):
        impl.choose(ints, device, Options())
    f64 = problem_of_specs(p, dataclasses.replace(x, dtype="float64"), dataclasses.replace(w, dtype="float64"))
    with pytest.raises(Unsupported, match="no double precision"):
        impl.choose(f64, dataclasses.replace(device, fp64=False), Options())
    assert impl.choose(f64, dataclasses.replace(device, fp64=True, kind="gpu"), Options()).algorithm == "igemm"
    with pytest.raises(Unsupported, match="not a depthwise problem"):
        impl.choose(f64, device, Options(algorithm="depthwise"))


def problem_of_specs(p, x, w):
    from portconv.problem import Problem

    return Problem(p, x, w, False)


def test_probe_without_pyopencl_names_the_extra(monkeypatch):
    rt._select.cache_clear()
    monkeypatch.setitem(sys.modules, "pyopencl", None)
    try:
        avail = rt.select(None)[0]
    finally:
        rt._select.cache_clear()
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
    rt._select.cache_clear()
    try:
        avail, pd = rt.select("cpu")
        assert avail and pd == (1, 0) and "passed over (compiler failed): 0:0 pthread-AMD EPYC" in avail.reason
        assert "unknown target CPU 'generic'" in avail.reason
        assert rt.select(None)[1] == (1, 0) and rt.select("0:0")[1] == (0, 0)
        monkeypatch.setattr(rt, "all_devices", lambda: [(0, 0, old)])
        rt._select.cache_clear()
        avail, pd = rt.select(None)
        assert not avail and pd is None and "no usable OpenCL device" in avail.reason
        assert "unknown target CPU 'generic'" in avail.reason and "pocl-opencl-icd" in avail.reason
    finally:
        rt._select.cache_clear()


def test_the_compiler_probe_passes_on_the_chosen_device():
    assert rt.compiler_problem(_device()) is None


@pytest.mark.parametrize("version,cpu,want", [
    ("OpenCL 3.0 PoCL 5.0+debian  Linux, None+Asserts, RELOC, SPIR, LLVM 16.0.6", True, "cbs"),
    ("OpenCL 3.0 PoCL 6.1  Linux, Release", True, "cbs"),
    ("OpenCL 3.0 PoCL 3.1+debian  Linux, None+Asserts, RELOC, SPIR, LLVM 15.0.6", True, None),  # CI's: default
    ("OpenCL 3.0 PoCL 5.0  Linux, CUDA", False, None),  # PoCL's GPU drivers: not its CPU work-group functions
    ("OpenCL 3.0 CUDA 13.0.98", False, None),
])
def test_pocl_work_group_method_rule(version, cpu, want):
    assert rt.pocl_work_group_method(version, cpu) == want  # Note [PoCL work-group method]


def test_a_users_pocl_work_group_method_is_kept(monkeypatch):
    monkeypatch.setenv("POCL_WORK_GROUP_METHOD", "loopvec")
    assert knobs.default_foreign("POCL_WORK_GROUP_METHOD", "cbs") == "loopvec"
    monkeypatch.delenv("POCL_WORK_GROUP_METHOD")
    assert knobs.default_foreign("POCL_WORK_GROUP_METHOD", "cbs") == "cbs"  # monkeypatch restores the absence


def test_device_selection_and_listing(knob_env):
    devs = rt.all_devices()
    infos = get("opencl").devices()
    assert len(infos) == len(devs) and all(i.runtime == "opencl" for i in infos)
    p, d, dev = devs[-1]
    assert rt.select(f"{p}:{d}")[1] == (p, d)
    assert rt.select(dev.name.strip()[:6].upper())[1] is not None  # case-insensitive substring
    miss = rt.select("no-such-opencl-device")[0]
    assert not miss and dev.name.strip() in miss.reason
    knob_env("PORTCONV_OPENCL_DEVICE", f"{p}:{d}")
    x, w = torch.randn(1, 2, 5, 5), torch.randn(3, 2, 3, 3)
    plan = portconv.plan(x, w, backend="opencl")
    assert plan.device.index == f"opencl:{p}:{d}"


def test_no_environment_reads_and_no_other_backend_imports():
    """Note [knobs]: no module of the opencl backend reads os.environ (or getenv); none imports another backend
    module: only portconv.backends' interface, portconv.backends.program and the opencl package itself."""
    import portconv.backends.opencl as pkg

    def own(module: str) -> bool:
        return module in ("portconv.backends", "portconv.backends.program") or \
            module.startswith("portconv.backends.opencl") or not module.startswith("portconv.backends")

    files = sorted(pathlib.Path(pkg.__file__).parent.glob("*.py"))
    assert {f.name for f in files} >= {"__init__.py", "select.py", "launch.py", "runtime.py"}
    for path in files:
        for node in ast.walk(ast.parse(path.read_text())):
            where = f"{path.name}:{getattr(node, 'lineno', 0)}"
            if isinstance(node, ast.Attribute):
                assert node.attr not in ("environ", "getenv", "putenv"), f"{where} reads the environment"
            elif isinstance(node, ast.Name):
                assert node.id not in ("environ", "getenv"), f"{where} reads the environment"
            elif isinstance(node, ast.Import):
                assert all(own(a.name) for a in node.names), f"{where} imports {[a.name for a in node.names]}"
            elif isinstance(node, ast.ImportFrom):
                mod = node.module or ""
                if node.level:  # relative to portconv.backends.opencl.<file>
                    mod = ".".join(["portconv", "backends", "opencl"][:4 - node.level] + ([mod] if mod else []))
                assert own(mod), f"{where} imports {mod}"
                if mod == "portconv.backends":  # names of the interface, or the program / opencl modules
                    assert all(a.name[0].isupper() or a.name in ("program", "opencl") for a in node.names), where
                assert not any(a.name in ("environ", "getenv") for a in node.names), f"{where} reads the environment"


def test_dw_and_ig_launch_counters_follow_the_kernels():
    """stats counts launches per kernel: conv.cl's by direction, depthwise.cl's as named, igemm.cl's with 'ig_'."""
    from portconv.backends.opencl.launch import stat_name

    assert [stat_name(k) for k in ("conv_fwd", "depthwise_bias_grad", "dw_cl_fwd", "igemm_finalize")] == \
        ["fwd", "bias_grad", "dw_cl_fwd", "ig_finalize"]
    x, w, b, p = dw_case((4, 6, 7), (3, 3))
    plan = opencl_plan(x, w, b, p)
    before = dict(rt.stats)
    plan.forward(x, w, b)
    assert launched_since(before) == {"dw_fwd": 1}


_FORK_SCRIPT = r"""
import os, sys, torch, portconv
from portconv.backends import get
from portconv.backends.opencl import runtime
from portconv.errors import BackendUnavailable
x, w = torch.randn(2, 4, 8, 8), torch.randn(4, 4, 3, 3)
portconv.conv2d(x, w, padding=1, backend="opencl")  # the parent uses OpenCL
plan = portconv.plan(x, w, padding=1, backend="opencl")


class Convs(torch.utils.data.Dataset):
    def __len__(self):
        return 4

    def __getitem__(self, i):
        return portconv.conv2d(x[i % 2:i % 2 + 1], w[:, :, :2], padding=1)[0]  # automatic plan in the worker


want = torch.nn.functional.conv2d(x, w[:, :, :2], padding=1)
got = list(torch.utils.data.DataLoader(Convs(), batch_size=None, num_workers=2, multiprocessing_context="fork"))
assert all(torch.allclose(g, want[i % 2], atol=1e-5) for i, g in enumerate(got))


def refused(call):
    try:
        call()
        return False
    except BackendUnavailable as e:
        return "forked after its parent used OpenCL" in str(e) and "'spawn' or 'forkserver'" in str(e)


built = runtime.stats["programs_built"]
pid = os.fork()
if pid == 0:
    os._exit(0 if refused(lambda: portconv.conv2d(x, w, padding=1, backend="opencl"))  # the parent's cached plan
             and refused(lambda: plan.backward(torch.ones(2, 4, 8, 8), x, w))  # its first backward: new programs
             and refused(lambda: portconv.conv2d(x, w, stride=2, backend="opencl"))  # a new plan: the probe
             and "forked after its parent used OpenCL" in get("opencl").probe().reason
             and runtime.stats["programs_built"] == built else 3)  # not one OpenCL call
_, status = os.waitpid(pid, 0)
assert os.waitstatus_to_exitcode(status) == 0, status
print("FORK-OK")
"""


@pytest.mark.skipif(not hasattr(__import__("os"), "fork"), reason="needs os.fork (POSIX)")
def test_forked_children_never_call_opencl():
    """Note [fork]: after the parent used OpenCL, DataLoader workers forked from it compute their convolutions on an
    automatic plan (ATen); in a forked child the probe says why (the parent's cached device choice notwithstanding)
    and a forced opencl call raises BackendUnavailable at once, on the parent's cached plan, on that plan's first
    backward (programs to build) and on a new plan; a hang would be the timeout."""
    import subprocess

    avail = get("opencl").probe()
    assert avail, avail.reason  # CI's PoCL: the scenario needs a parent that used OpenCL
    r = subprocess.run([sys.executable, "-c", _FORK_SCRIPT], capture_output=True, text=True, timeout=120,
                       cwd=pathlib.Path(__file__).resolve().parents[1])
    assert r.returncode == 0 and "FORK-OK" in r.stdout, r.stdout[-2000:] + r.stderr[-3000:]


def test_negative_bit_views_are_read_negated():
    """A view with torch's negative bit (torch._neg_view, conj().imag) is computed as its values, forward and
    backward, not refused with numpy's message nor read un-negated."""
    g = torch.Generator().manual_seed(0)
    x, w, go = (torch.randn(s, generator=g) for s in ((2, 3, 6, 7), (4, 3, 3, 3), (2, 4, 4, 5)))
    nx, nw, ngo = (torch._neg_view(t) for t in (x, w, go))
    assert nx.is_neg() and nw.is_neg() and ngo.is_neg()
    y = portconv.conv2d(nx, nw, backend="opencl")
    assert torch.allclose(y, F.conv2d(-x, -w), atol=1e-5)
    gi, gw, _ = portconv.convolution_backward(ngo, nx, nw, None, [1, 1], [0, 0], [1, 1], False, [0, 0], 1,
                                              (True, True, False), backend="opencl")
    ri, rw, _ = torch.ops.aten.convolution_backward(-go, -x, -w, None, [1, 1], [0, 0], [1, 1], False, [0, 0], 1,
                                                    [True, True, False])
    assert torch.allclose(gi, ri, atol=1e-5) and torch.allclose(gw, rw, atol=1e-4)


def _stride0(n, h, w):
    return torch.ones(1, 1, 1, 1).expand(n, 1, h, w)  # 2^31 positions in a 4-byte span


def test_reductions_over_2_31_positions_index_in_64_bits():
    """Issue 32 point 2: the index width follows element counts, not spans, so a weight or bias gradient over 2^31
    positions of stride-0 operands is indexed (and its descriptor packed) in 64 bits, whatever the mask; before,
    grad_weight returned 0 (a negative 32-bit reduction length) and grad_bias raised numpy's OverflowError."""
    from portconv.params import ConvParams
    from portconv.planner import backward_problem, select

    x, go, w = _stride0(2**15, 256, 256), _stride0(2**15, 256, 256), torch.ones(1, 1, 1, 1)
    params = ConvParams.make(2, 1, 0, 1, weight_shape=(1, 1, 1, 1), backward=True)
    for mask in ((False, True, False), (False, False, True), (True, True, True)):
        p = select(backward_problem(go, x, w, params, [1], mask), "opencl")
        lay = p.runner.loader.layout
        for k in p.runner.build("backward", mask, (lay(go), lay(x), lay(w))):
            assert all(any(d == "IDX64" for d, _ in la.module.defines) for la in k.launches), (mask, k.lines())
    _, _, gb = portconv.convolution_backward(go, x, w, [1], [1, 1], [0, 0], [1, 1], False, [0, 0], 1,
                                             (False, False, True), backend="opencl")
    assert gb.item() == 2.0**31  # a work-group of 256 partial sums, each exact in float32
