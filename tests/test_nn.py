"""portconv.nn modules (state_dict-compatible with torch.nn, numerically equal to it), convert() and revert()."""
from __future__ import annotations

import copy
import pickle

import pytest
import torch

import portconv.nn as pnn

CASES = [
    (pnn.Conv1d, torch.nn.Conv1d, dict(in_channels=4, out_channels=6, kernel_size=3, padding=1), (2, 4, 11)),
    (pnn.Conv2d, torch.nn.Conv2d, dict(in_channels=4, out_channels=6, kernel_size=3, stride=2, groups=2), (2, 4, 9, 8)),
    (pnn.Conv2d, torch.nn.Conv2d, dict(in_channels=3, out_channels=4, kernel_size=4, padding="same",
                                       padding_mode="reflect"), (1, 3, 7, 7)),
    (pnn.Conv3d, torch.nn.Conv3d, dict(in_channels=2, out_channels=3, kernel_size=2, dilation=2), (1, 2, 5, 6, 5)),
    (pnn.ConvTranspose1d, torch.nn.ConvTranspose1d, dict(in_channels=4, out_channels=2, kernel_size=3, stride=2),
     (2, 4, 7)),
    (pnn.ConvTranspose2d, torch.nn.ConvTranspose2d, dict(in_channels=4, out_channels=6, kernel_size=4, stride=2,
                                                         padding=1, groups=2), (2, 4, 5, 5)),
    (pnn.ConvTranspose3d, torch.nn.ConvTranspose3d, dict(in_channels=2, out_channels=2, kernel_size=3, stride=2,
                                                         output_padding=1), (1, 2, 3, 4, 3)),
]


def _backends():
    from portconv import backends

    out = ["aten"]
    try:
        if backends.get("opencl").probe():
            out.append("opencl")
    except Exception:  # noqa: BLE001 - a broken opencl backend leaves the aten tests running
        pass
    return out


@pytest.mark.parametrize("nn_backend", _backends())
@pytest.mark.parametrize("ours,theirs,kw,shape", CASES, ids=[f"{c[0].__name__}-{i}" for i, c in enumerate(CASES)])
def test_module_matches_torch(ours, theirs, kw, shape, nn_backend):
    torch.manual_seed(0)
    ref = theirs(**kw).double()
    mod = ours(**kw, backend=nn_backend).double()
    missing, unexpected = mod.load_state_dict(ref.state_dict())
    assert not missing and not unexpected
    assert set(mod.state_dict()) == set(ref.state_dict())
    x = torch.randn(shape, dtype=torch.float64, requires_grad=True)
    x2 = x.detach().clone().requires_grad_(True)
    y, y_ref = mod(x), ref(x2)
    assert y.shape == y_ref.shape
    torch.testing.assert_close(y, y_ref, rtol=1e-10, atol=1e-10)
    g = torch.randn_like(y)
    y.backward(g)
    y_ref.backward(g)
    torch.testing.assert_close(x.grad, x2.grad, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(mod.weight.grad, ref.weight.grad, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(mod.bias.grad, ref.bias.grad, rtol=1e-10, atol=1e-10)


def test_repr_names_backend():
    assert "backend='opencl'" in repr(pnn.Conv2d(1, 1, 3, backend="opencl"))


class _KeepsForward(torch.nn.Conv2d):
    """A subclass with torch.nn's forward: convert() converts it."""

    tag = "kept"


class _OwnForward(torch.nn.Conv2d):
    def forward(self, x):
        return super().forward(x) + 1


def _model():
    torch.manual_seed(0)
    nn = torch.nn
    m = nn.Sequential(nn.Conv2d(3, 6, 3, padding=1, padding_mode="circular"), nn.BatchNorm2d(6), nn.ReLU(),
                      _KeepsForward(6, 6, 3, padding=1, groups=3), _OwnForward(6, 6, 1),
                      nn.ConvTranspose2d(6, 4, 2, stride=2))
    return m.double().eval()


def _hook_calls(model) -> list:
    calls = []
    model[0].register_forward_hook(lambda mod, i, o: calls.append("hook"))
    model[5].register_forward_pre_hook(lambda mod, i: calls.append("pre"))
    return calls


@pytest.mark.parametrize("nn_backend", _backends())
def test_convert_copies_and_keeps_everything(nn_backend):
    model = _model()
    calls = _hook_calls(model)
    before = copy.deepcopy(model.state_dict())
    ours = pnn.convert(model, backend=nn_backend)
    assert [type(m) for m in model] == [type(m) for m in _model()]  # the model itself is unchanged
    assert type(ours[0]) is pnn.Conv2d and type(ours[5]) is pnn.ConvTranspose2d
    assert isinstance(ours[3], _KeepsForward) and isinstance(ours[3], torch.nn.Conv2d) and ours[3].tag == "kept"
    assert type(ours[4]) is _OwnForward  # a forward of its own: left alone
    assert ours[0].padding_mode == "circular" and not ours.training and ours[0].backend == nn_backend
    assert ours[0].weight is not model[0].weight and ours[0].weight.dtype == torch.float64
    assert list(ours.state_dict()) == list(before)
    for k, v in ours.state_dict().items():
        assert torch.equal(v, before[k])
    x = torch.randn(2, 3, 6, 6, dtype=torch.float64)
    calls.clear()
    y_ref = model(x)
    n_ref = len(calls)
    torch.testing.assert_close(ours(x), y_ref, rtol=1e-10, atol=1e-10)
    assert len(calls) == 2 * n_ref == 4
    assert "backend=" in repr(ours[3]) and "padding_mode=circular" in repr(ours[0])


def test_convert_inplace_keeps_the_parameter_objects():
    model = _model().train()
    params = list(model.parameters())
    buffers = list(model.buffers())
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    ours = pnn.convert(model, backend="aten", inplace=True)
    assert ours is model and type(model[0]) is pnn.Conv2d and model.training
    assert all(a is b for a, b in zip(model.parameters(), params)) and all(
        a is b for a, b in zip(model.buffers(), buffers))
    w0 = model[0].weight.detach().clone()
    model(torch.randn(2, 3, 6, 6, dtype=torch.float64)).sum().backward()
    opt.step()
    assert not torch.equal(params[0].detach(), w0)


def test_revert_gives_torch_modules_and_pickles():
    ours = pnn.convert(_model(), backend="aten")
    restored = pickle.loads(pickle.dumps(ours))
    assert type(restored[3]) is type(ours[3])
    plain = pnn.revert(ours)
    assert type(ours[0]) is pnn.Conv2d  # inplace=False left it
    assert [type(m) for m in plain] == [type(m) for m in _model()]
    assert "backend" not in vars(plain[0]) and "backend" not in repr(plain)
    assert list(plain.state_dict()) == list(ours.state_dict())
    assert pnn.revert(pnn.Conv2d(1, 1, 3), inplace=True).__class__ is torch.nn.Conv2d


def test_convert_parametrized_and_lazy_modules():
    from torch.nn.utils import parametrizations, parametrize

    conv = parametrizations.weight_norm(torch.nn.Conv2d(2, 3, 3).double())
    lazy = torch.nn.LazyConv2d(3, 3)
    ours = pnn.convert(torch.nn.Sequential(conv, lazy), backend="aten")
    assert isinstance(ours[0], pnn.Conv2d) and parametrize.is_parametrized(ours[0], "weight")
    assert type(ours[1]) is torch.nn.LazyConv2d
    x = torch.randn(1, 2, 5, 5, dtype=torch.float64)
    torch.testing.assert_close(ours[0](x), conv(x), rtol=1e-10, atol=1e-10)
    plain = pnn.revert(ours)
    assert type(plain[0]).__bases__[0] is torch.nn.Conv2d and parametrize.is_parametrized(plain[0], "weight")
    torch.testing.assert_close(plain[0](x), conv(x), rtol=1e-10, atol=1e-10)
    parametrize.remove_parametrizations(ours[0], "weight")
    assert type(ours[0]) is pnn.Conv2d
    torch.testing.assert_close(ours[0](x), conv(x), rtol=1e-10, atol=1e-10)


def _convnd_calls(monkeypatch):
    """Counts the calls that take functional._convnd (the fast-path key) instead of a module's memo."""
    from portconv import functional

    calls, inner = [], functional._convnd
    monkeypatch.setattr(functional, "_convnd", lambda *a, **k: calls.append(1) or inner(*a, **k))
    return calls


def test_module_memo_runs_the_same_plan_and_notices_every_change(monkeypatch):
    """Note [module memo]: a repeated call skips the key; any change the key would see takes the full path."""
    import portconv
    from portconv import planner

    torch.manual_seed(0)
    ref = torch.nn.Conv2d(4, 4, 3, padding=1, groups=4)  # depthwise: Note [ATen's modules] does not take it
    mod = portconv.convert(copy.deepcopy(ref))
    x = torch.randn(2, 4, 6, 6)
    calls = _convnd_calls(monkeypatch)

    def full(f) -> int:
        """How many of f's calls took the full path."""
        before = len(calls)
        f()
        return len(calls) - before

    assert full(lambda: mod(x)) == 1 and mod.__dict__["_pc_memo"] is not None
    assert full(lambda: [torch.testing.assert_close(mod(x), ref(x), rtol=0, atol=0) for _ in range(3)]) == 0
    assert full(lambda: mod(torch.randn(3, 4, 6, 6))) == 1  # shape
    assert full(lambda: mod(x.to(memory_format=torch.channels_last))) == 1  # strides
    assert full(lambda: mod.double()(x.double())) == 1  # dtypes (the parameters' too)
    assert full(lambda: mod.float()(x)) == 1

    def restride(strides):
        w = mod.weight.data  # the same Parameter object with new data, as Module.to() does
        mod.weight.data = torch.empty_strided(w.shape, strides).copy_(w)
        torch.testing.assert_close(mod(x), ref(x))

    assert full(lambda: restride((9, 1, 3, 1))) == 1
    assert full(lambda: restride((9, 9, 3, 1))) == 1
    with portconv.use_backend("aten"):  # the call state
        assert full(lambda: mod(x)) == 1
    mod.stride = (1, 1)  # a new argument object
    assert full(lambda: mod(x)) == 1
    planner.clear_cache()  # dropped plans: the memo is stale too
    assert full(lambda: mod(x)) == 1
    assert full(lambda: mod(x)) == 0
    with torch.autocast("cpu", dtype=torch.bfloat16):  # ATen's plan under autocast: the memo keeps that finding
        # the first call finds the plan and keeps the finding (Note [autocast and ATen's plans]); the others the memo
        assert full(lambda: [mod(x) for _ in range(3)]) == 1 and mod.__dict__["_pc_memo"].entry is None
        got, want = mod(x), ref(x)
        assert got.dtype == want.dtype == torch.bfloat16
        torch.testing.assert_close(got, want, rtol=0, atol=0)
    with torch.autocast("cpu", dtype=torch.float16):  # another autocast dtype: the full path
        assert full(lambda: mod(x)) == 1
    assert full(lambda: [mod(x) for _ in range(2)]) == 1  # autocast off


def test_module_memo_under_autocast_runs_the_own_plan_of_the_cast_operands(monkeypatch):
    """Note [module memo]: a module on portconv's own kernels (OpenCL here) under autocast keeps the entry of the cast
    operands under the key of the uncast ones; a matching call casts and runs it, exactly as the full path does."""
    import portconv

    torch.manual_seed(0)
    mod = portconv.convert(torch.nn.Conv2d(4, 6, 3, padding=1, groups=2), backend="opencl")
    x = torch.randn(2, 4, 7, 7, requires_grad=True)
    calls = _convnd_calls(monkeypatch)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        first = mod(x)
        assert len(calls) == 1 and mod.__dict__["_pc_memo"].entry is not None  # not ATen's plan: its entry
        again = [mod(x) for _ in range(3)]
        assert len(calls) == 1  # the memo
    assert first.dtype == torch.bfloat16
    for y in again:
        torch.testing.assert_close(y, first, rtol=0, atol=0)
    with torch.autocast("cpu", dtype=torch.float16):  # another autocast dtype: the full path
        mod(x)
    assert len(calls) == 2
    (gx,) = torch.autograd.grad(again[0].float().sum(), x)  # the memo's call is recorded as the full path's
    (gx_full,) = torch.autograd.grad(first.float().sum(), x)
    torch.testing.assert_close(gx, gx_full, rtol=0, atol=0)


def test_single_group_and_transposed_modules_call_pytorch_under_the_automatic_plan(monkeypatch):
    """Note [ATen's modules]: a converted Conv2d with groups=1 and a ConvTranspose2d run torch.nn.functional's own
    call under the automatic plan, plain and under autocast, with no plan or memo; a depthwise module, a module with
    a backend, use_backend(), tuning and options blocks take portconv's path (counted as the fast-path keys built:
    the plan's lookup, which PyTorch's own call never makes)."""
    import portconv
    from portconv import fastpath

    torch.manual_seed(0)
    refs = [torch.nn.Conv2d(3, 4, 3, padding=1), torch.nn.ConvTranspose2d(3, 4, 3, stride=2, output_padding=1),
            torch.nn.Conv2d(3, 3, 3, padding=1, groups=3)]
    mods = [portconv.convert(r) for r in refs]
    x = torch.randn(2, 3, 6, 6, requires_grad=True)
    calls, key = [], fastpath.key
    monkeypatch.setattr(fastpath, "key", lambda *a, **k: calls.append(1) or key(*a, **k))
    for amp in (False, True):
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=amp):
            for ref, mod in zip(refs, mods):
                before = len(calls)
                got, want = mod(x), ref(x)
                torch.testing.assert_close(got, want, rtol=0, atol=0)
                gx, = torch.autograd.grad(got.float().sum(), x)
                gx_want, = torch.autograd.grad(want.float().sum(), x)
                torch.testing.assert_close(gx, gx_want, rtol=0, atol=0)
                assert (len(calls) - before == 0) == (mod.groups == 1), (type(mod).__name__, amp)
    assert all("_pc_memo" not in m.__dict__ for m in mods[:2])
    dense = mods[0]
    for ctx in (portconv.use_backend("aten"), portconv.tune(), portconv.options(algorithm="direct")):
        with ctx:
            before = len(calls)
            try:
                dense(x)
            except Exception:  # noqa: BLE001 - a forced choice may refuse; it was asked, which is what counts
                pass
            assert len(calls) == before + 1
    before = len(calls)
    portconv.convert(refs[0], backend="aten")(x)
    assert len(calls) == before + 1


def test_module_memo_is_not_copied_or_pickled():
    import portconv

    mod = portconv.convert(torch.nn.Conv1d(2, 4, 3, groups=2))  # depthwise: Note [ATen's modules] keeps no memo
    x = torch.randn(1, 2, 7)
    mod(x)
    assert mod.__dict__["_pc_memo"] is not None
    for other in (copy.deepcopy(mod), pickle.loads(pickle.dumps(mod))):
        assert other.__dict__.get("_pc_memo") is None
        torch.testing.assert_close(other(x), mod(x))
