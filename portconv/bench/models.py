"""`portconv bench --models`: training steps of whole models, PyTorch against portconv.convert() of the same model."""
from __future__ import annotations

# Commands (a GPU machine with torchvision; every flag: `portconv bench --help`, group "model benchmark"):
#   portconv bench --models --out out/models --resume      # the whole matrix; run again until it says complete
#   portconv bench --models mobilenet_v2,resnet50 --dtypes float32 --layouts nchw --modes eager --steps 10 --batch 32
#   portconv bench --models --first-step --out out/models --resume    # first step cold / warm, fresh processes
#   portconv bench --models autoencoder --backend auto,cuda --modes compile --out out/ae
import contextlib
import copy
import dataclasses
from collections.abc import Callable

import torch
import torch.nn as nn

DTYPES = ("float32", "bfloat16")
LAYOUTS = ("nchw", "channels_last")
MODES = ("eager", "compile")
TURN = 5  # Note [interleaved entries]: timed steps a turn
# |loss(portconv) - loss(PyTorch)| / |loss(PyTorch)| allowed at the compared step (issue 29: 1e-4 in float32 with TF32
# off; bfloat16 AMP: a bound of our choosing for its usual noise, 8 mantissa bits through every layer and step)
LOSS_LIMITS = {"float32": 1e-4, "tf32": 5e-3, "bfloat16": 5e-2}
# A side that is PyTorch's model again (another deep copy, timed in the same turns): its `x PyTorch` is what the cell
# resolves. Host-bound cells spread by several percent between two identical models on a GPU machine's host.
CONTROL = "torch-copy"


class AutoEncoder(nn.Module):
    """64x64 images: a strided Conv2d encoder down to 4x4, then ConvTranspose2d layers (stride 2, output_padding 1)
    back to 64x64; trained on the reconstruction error."""

    def __init__(self, widths=(32, 64, 128, 256)):
        super().__init__()
        enc, dec, c = [], [], 3
        for w in widths:
            enc += [nn.Conv2d(c, w, 3, stride=2, padding=1, bias=False), nn.BatchNorm2d(w), nn.ReLU(inplace=True)]
            c = w
        for w in reversed((3,) + widths[:-1]):
            dec.append(nn.ConvTranspose2d(c, w, 3, stride=2, padding=1, output_padding=1))
            if w != 3:
                dec += [nn.BatchNorm2d(w), nn.ReLU(inplace=True)]
            c = w
        self.encoder, self.decoder = nn.Sequential(*enc), nn.Sequential(*dec)

    def forward(self, x):
        return self.decoder(self.encoder(x))


@dataclasses.dataclass(frozen=True)
class ModelSpec:
    """A benchmark model: how to build it (called under torch.manual_seed: both sides start from this one init),
    one sample's shape (C, H, W) or (C, D, H, W), and the task."""

    name: str
    build: Callable
    sample: tuple[int, ...]
    classes: int | None  # labels in [0, classes) and cross-entropy; None: reconstruction, MSE against the input
    batch: int
    needs: str | None = None  # a module the builder imports, checked before the run
    ref: str | None = None  # 'module:attr' naming this spec, so a fresh process (--first-step) finds it

    @property
    def spatial(self) -> int:
        return len(self.sample) - 1


def _torchvision(name: str, video: bool = False):
    def build():
        import torchvision.models as tvm

        return getattr(tvm.video if video else tvm, name)(weights=None)
    return build


BUILTIN = {s.name: s for s in (
    ModelSpec("mobilenet_v2", _torchvision("mobilenet_v2"), (3, 224, 224), 1000, 64, "torchvision"),
    ModelSpec("efficientnet_b0", _torchvision("efficientnet_b0"), (3, 224, 224), 1000, 64, "torchvision"),
    ModelSpec("convnext_tiny", _torchvision("convnext_tiny"), (3, 224, 224), 1000, 64, "torchvision"),
    ModelSpec("resnet50", _torchvision("resnet50"), (3, 224, 224), 1000, 64, "torchvision"),
    ModelSpec("r3d_18", _torchvision("r3d_18", video=True), (3, 16, 112, 112), 400, 8, "torchvision"),
    ModelSpec("autoencoder", AutoEncoder, (3, 64, 64), None, 64),
)}


def resolve(name: str) -> ModelSpec:
    """A builtin model by name, or 'module:attr' naming a ModelSpec (or a function returning one)."""
    if name in BUILTIN:
        return BUILTIN[name]
    if ":" not in name:
        raise ValueError(f"unknown model {name!r}: {', '.join(BUILTIN)} or 'module:attr' naming a ModelSpec")
    import importlib

    mod, _, attr = name.partition(":")
    obj = getattr(importlib.import_module(mod), attr)
    spec = obj() if callable(obj) and not isinstance(obj, ModelSpec) else obj
    if not isinstance(spec, ModelSpec):
        raise ValueError(f"{name} is not a ModelSpec")
    return dataclasses.replace(spec, ref=name)


@dataclasses.dataclass
class Options:
    dtypes: tuple[str, ...] = DTYPES
    layouts: tuple[str, ...] = LAYOUTS
    modes: tuple[str, ...] = MODES
    backends: tuple[str, ...] = ("auto",)  # the portconv sides; 'auto' = convert() with the default plan
    steps: int = 20  # timed steps per side
    warmup: int = 3  # untimed steps first (the first one included; at least 2: timing._warm_up)
    loss_steps: int = 20  # the loss compared is the one of this step (or the last step taken)
    loss_f64: bool = False  # float32 cells: PyTorch's model in float64 takes the loss steps too (Note [loss phase])
    batch: int | None = None  # every 2-D model's batch (None: the spec's)
    batch_3d: int | None = None  # every 3-D model's batch
    device: str | None = None
    seed: int = 0
    compile_backend: str = "inductor"
    tf32: bool = False  # False: float32 convolutions and matmuls in IEEE on both sides (Note [model bench precision])
    lr: float = 0.01
    momentum: float = 0.9
    budget_s: float | None = None  # start no cell after this many seconds; the rest is reported as not run
    done: dict = dataclasses.field(default_factory=dict)  # finished cells of an earlier run, by key (--resume)
    log: Callable[[str], None] | None = None
    on_cell: Callable[[dict], None] | None = None  # called with the partial report after each cell

    def batch_of(self, spec: ModelSpec) -> int:
        given = self.batch_3d if spec.spatial == 3 else self.batch
        return given if given is not None else spec.batch


def key(cell: dict) -> str:
    return "/".join(str(cell[k]) for k in ("model", "dtype", "layout", "mode"))


def torch_device(device: str | None):
    dev = torch.device(device) if device else torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if dev.type == "cuda" and dev.index is None:
        dev = torch.device("cuda", torch.cuda.current_device())
    return dev


# Note [model bench precision]
# The loss comparison needs both sides to compute float32 the same way: with TF32 on, cuDNN and cuBLAS round
# operands to 10 mantissa bits and 20 steps of training amplify that past any useful bound. So by default float32
# convolutions and matmuls run IEEE on both sides for the whole run (portconv's own kernels read the same switch,
# rules.conv_tf32), float32 and AMP bfloat16 cells alike (under autocast the convolutions run in bfloat16 anyway).
# --allow-tf32 keeps torch's settings as found; float32 losses are then held to LOSS_LIMITS['tf32']. Where torch has
# the per-op API (2.9+) it is used, as the row bench's torch-ieee entry does: the legacy getter
# torch.backends.cudnn.allow_tf32 then raises (conv and RNN differ), and nothing on the timed path reads it (inductor
# only in its max-autotune convolution templates).
@contextlib.contextmanager
def precision(ieee: bool, device):
    """float32 convolutions and matmuls in IEEE inside the block (CUDA; a CPU has no TF32); yields what was set."""
    if not ieee or device.type != "cuda":
        yield ["torch's float32 settings as found" if not ieee else "CPU: float32 is IEEE"]
        return
    b = torch.backends
    conv = getattr(b.cudnn, "conv", None)
    if conv is not None and hasattr(conv, "fp32_precision") and hasattr(b.cuda.matmul, "fp32_precision"):
        objs, attr, value = (conv, b.cuda.matmul), "fp32_precision", "ieee"
        said = ["torch.backends.cudnn.conv.fp32_precision = 'ieee'", "torch.backends.cuda.matmul.fp32_precision = "
                "'ieee'"]
    else:
        objs, attr, value = (b.cudnn, b.cuda.matmul), "allow_tf32", False
        said = ["torch.backends.cudnn.allow_tf32 = False", "torch.backends.cuda.matmul.allow_tf32 = False"]
    old = [getattr(o, attr) for o in objs]
    try:
        for o in objs:
            setattr(o, attr, value)
        yield said
    finally:
        for o, v in zip(objs, old):
            setattr(o, attr, v)


@contextlib.contextmanager
def deterministic(device):
    """Note [loss phase]: cuDNN's deterministic algorithms and PyTorch's deterministic ops (warn-only: an op without
    a deterministic kernel still runs) inside the block; cudnn.benchmark off."""
    import warnings

    b = torch.backends.cudnn
    old = (b.deterministic, b.benchmark, torch.are_deterministic_algorithms_enabled(),
           torch.is_deterministic_algorithms_warn_only_enabled())
    try:
        b.deterministic, b.benchmark = True, False
        torch.use_deterministic_algorithms(True, warn_only=True)
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*does not have a deterministic implementation.*")
            yield
    finally:
        b.deterministic, b.benchmark = old[0], old[1]
        torch.use_deterministic_algorithms(old[2], warn_only=old[3])


def no_dropout(model) -> int:
    """Dropout and stochastic depth off (p = 0; how many modules): both sides then compute one deterministic function
    of the same data, in eager and compiled mode alike (inductor draws its random numbers its own way)."""
    n = 0
    for m in model.modules():
        if isinstance(m, nn.modules.dropout._DropoutNd) or type(m).__name__ == "StochasticDepth":
            m.p, n = 0.0, n + 1
    return n


def memory_format(layout: str, spec: ModelSpec):
    if layout == "nchw":
        return torch.contiguous_format
    return torch.channels_last_3d if spec.spatial == 3 else torch.channels_last


def batches(spec: ModelSpec, batch: int, device, fmt, seed: int, count: int = 2) -> list[tuple]:
    """``count`` fixed-seed (input, target) pairs on the device: uniform [-1, 1) images, random labels (classifiers)
    or the input itself (reconstruction)."""
    gen = torch.Generator(device=device).manual_seed(seed)
    out = []
    for _ in range(count):
        x = torch.rand((batch, *spec.sample), generator=gen, device=device).mul_(2).sub_(1)
        x = x.contiguous(memory_format=fmt)
        y = x if spec.classes is None else torch.randint(0, spec.classes, (batch,), generator=gen, device=device)
        out.append((x, y))
    return out


def build_side(base, side: str, device, fmt, mode: str, opts: Options):
    """(model to call, optimizer) of one side: PyTorch ('torch') or portconv.convert() of a copy of ``base``."""
    import portconv

    if side in ("torch", CONTROL):
        model = copy.deepcopy(base)
    else:
        model = portconv.convert(base, None if side == "auto" else side)
    model = model.to(device).to(memory_format=fmt).train()
    opt = torch.optim.SGD(model.parameters(), lr=opts.lr, momentum=opts.momentum)
    call = torch.compile(model, backend=opts.compile_backend) if mode == "compile" else model
    return call, opt


def make_step(call, opt, data: list[tuple], spec: ModelSpec, dtype: str, device, losses: list,
              host: list | None = None):
    """One training step per call (its argument is ignored): batch i % len(data) on call i, forward and loss (under
    autocast for bfloat16), backward, SGD; the loss is kept as a device tensor (no sync inside the step). ``host``:
    each step appends its phases' wall seconds (forward and loss, backward, optimizer; Note [host phases])."""
    import time

    import torch.nn.functional as F

    amp = dtype == "bfloat16"
    i = [0]

    def step(_):
        x, y = data[i[0] % len(data)]
        i[0] += 1
        t0 = time.perf_counter()
        with torch.autocast(device.type, dtype=torch.bfloat16) if amp else contextlib.nullcontext():
            out = call(x)
            loss = F.mse_loss(out, y) if spec.classes is None else F.cross_entropy(out, y)
        t1 = time.perf_counter()
        loss.backward()
        t2 = time.perf_counter()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if host is not None:
            host.append((t1 - t0, t2 - t1, time.perf_counter() - t2))
        losses.append(loss.detach())
    return step


# Note [host phases]
# A step's host time a phase: wall time from the host's view of forward and loss, backward, and the optimizer (with
# zero_grad), with no synchronisation inside the step. On a GPU these are the times the host takes to enqueue the
# work, unless the device's queue is full and blocks a launch; where their sum comes near the step's time the step is
# host-bound, and a side's extra host time is its extra step time (PyTorch against convert(): where a host-bound
# cell's difference lies). On the CPU they are the compute itself. The report takes each phase's median over a side's
# timed steps, the steps of its step median (models_run._TimedHost).
HOST_PHASES = ("forward", "backward", "optimizer")


def error_text(e: BaseException) -> str:
    return f"{type(e).__name__}: {e}"[:3000]


class Bases:
    """Each model built once (under the seed, on the CPU, dropout off); cells deep-copy it."""

    def __init__(self, seed: int):
        self.seed, self.made = seed, {}

    def get(self, spec: ModelSpec):
        if spec.name not in self.made:
            try:
                with torch.random.fork_rng(devices=[]):
                    torch.manual_seed(self.seed)
                    m = spec.build()
                self.made[spec.name] = (m, no_dropout(m))
            except Exception as e:  # noqa: BLE001 - the model's cells report it
                self.made[spec.name] = e
        got = self.made[spec.name]
        if isinstance(got, BaseException):
            raise got
        return got


