"""Every knob portconv reads: the PORTCONV_* environment (typed, read once) and the developer Options."""
from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import os
from collections.abc import Callable

# Note [knobs]
# This module is the only reader of portconv's environment variables. They are read once, on first use, into a
# frozen Env; a process that changes one later calls reload() (tests: the `knobs` fixture of tests/conftest.py).
# Every value is parsed when read: a malformed one raises ValueError naming the variable and what it takes.
# Kernel choices for sweeps and tests are not environment variables: they are fields of Options, set with
# portconv.options(...) for a block, and part of every plan's cache key like the Env itself.

BACKENDS = ("opencl", "cuda", "hip", "cudnn", "miopen", "aten")
OPENCL_DENSE = ("direct", "igemm")  # Note [OpenCL dense algorithm]
OPENCL_TC = ("off", "ptx", "portable")  # Note [OpenCL tensor cores]
ALGORITHMS = ("direct", "implicit_gemm", "igemm-tc", "depthwise")  # the own kernel sets' families
TC_TILES = ("128x128", "128x64", "64x128", "128x16")  # Note [tile rule] (cuda/conv_igemm_tc.cuh)
NATIVE = ("auto", "wait", "off")  # Note [native executor]


def _flag(name: str, v: str) -> bool:
    low = v.strip().lower()
    if low in ("1", "true", "yes", "on"):
        return True
    if low in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"{name}={v!r}: expected 1 or 0")


def _one_of(values: tuple[str, ...]) -> Callable[[str, str], str]:
    def parse(name: str, v: str) -> str:
        low = v.strip().lower()
        if low not in values:
            raise ValueError(f"{name}={v!r}: expected one of {', '.join(values)}")
        return low
    return parse


def _backend(name: str, v: str) -> str | None:
    low = v.strip().lower()
    return None if low == "auto" else _one_of(BACKENDS)(name, low)


def _backend_set(name: str, v: str) -> frozenset[str]:
    return frozenset(_one_of(BACKENDS)(name, s) for s in v.split(",") if s.strip())


def _text(name: str, v: str) -> str:
    return v


def _whole(low: int) -> Callable[[str, str], int]:
    def parse(name: str, v: str) -> int:
        try:
            n = int(v.strip())
        except ValueError:
            n = low - 1
        if n < low:
            raise ValueError(f"{name}={v!r}: expected a whole number >= {low}")
        return n
    return parse


def _default_cache() -> str:
    return os.path.join(os.path.expanduser("~"), ".cache", "portconv")


@dataclasses.dataclass(frozen=True)
class Knob:
    name: str
    field: str  # the Env field it sets
    parse: Callable[[str, str], object]
    help: str


KNOBS: tuple[Knob, ...] = (
    Knob("PORTCONV_BACKEND", "backend", _backend,
         "force one backend for every call: " + ", ".join(BACKENDS) + " (auto: the planner's choice)"),
    Knob("PORTCONV_DISABLE", "disable", _backend_set, "comma-separated backends the planner must not choose"),
    Knob("PORTCONV_OPENCL_DEVICE", "opencl_device", _text,
         "OpenCL device for CPU tensors: 'P:D', 'gpu', 'cpu' or a substring of the platform or device name "
         "(default: the first GPU, else the first CPU device whose compiler works)"),
    Knob("PORTCONV_OPENCL_DENSE", "opencl_dense", _one_of(OPENCL_DENSE),
         "OpenCL kernels for dense problems: igemm (tiled implicit GEMM, the default) or direct"),
    Knob("PORTCONV_OPENCL_TC", "opencl_tc", _one_of(OPENCL_TC),
         "tensor-core products in the OpenCL implicit GEMM: off, ptx, portable (plain OpenCL C, any device); "
         "default: ptx on NVIDIA sm_80+ where TF32 rules allow, else off"),
    Knob("PORTCONV_POISON", "poison", _flag, "1: fill results with NaN before kernels run (the conformance suite)"),
    Knob("PORTCONV_CACHE_DIR", "cache_dir", _text,
         "folder of compiled kernels and tuning results (default ~/.cache/portconv)"),
    Knob("PORTCONV_PLAN_CACHE", "plan_cache", _whole(1),
         "plans (and fast-path entries) kept per process, least recently used first out (default 4096)"),
    Knob("PORTCONV_COMPILE_THREADS", "compile_threads", _whole(0),
         "threads that compile a plan's CUDA/HIP kernels ahead of its first calls (default: up to 8, one per CPU); "
         "0: each kernel compiles when first launched (Note [compile ahead])"),
    Knob("PORTCONV_TUNE", "tune", _flag, "1: time the candidate backends once per problem and keep the fastest"),
    Knob("PORTCONV_NATIVE", "native", _one_of(NATIVE),
         "the native executor (Note [native executor]): auto (built in the background at first use, the default), "
         "wait (built at first use, waited for), off (every call in Python)"),
    Knob("PORTCONV_CUDA_PDL", "cuda_pdl", _flag,
         "0: launch split finalizes the ordinary way, not as dependent launches (Note [dependent launch])"),
)
KNOB_NAMES = tuple(k.name for k in KNOBS)


class _HashedOnce:
    """A frozen dataclass that sits in every call's cache key (Note [fast path]): its hash is computed once, as
    the dataclass would compute it (the tuple of its fields), and kept in the instance."""

    def __hash__(self) -> int:
        h = self.__dict__.get("_hash")
        if h is None:
            h = hash(tuple(getattr(self, f.name) for f in dataclasses.fields(self)))
            object.__setattr__(self, "_hash", h)
        return h

    def __getstate__(self) -> dict:  # a str's hash differs between processes: the kept one is not pickled
        return {k: v for k, v in self.__dict__.items() if k != "_hash"}


@dataclasses.dataclass(frozen=True)
class Env(_HashedOnce):
    """The PORTCONV_* environment, parsed."""

    __hash__ = _HashedOnce.__hash__  # kept by @dataclass (an explicit __hash__ in the class body)

    backend: str | None = None
    disable: frozenset[str] = frozenset()
    opencl_device: str | None = None
    opencl_dense: str | None = None
    opencl_tc: str | None = None
    poison: bool = False
    cache_dir: str = dataclasses.field(default_factory=_default_cache)
    plan_cache: int = 4096
    compile_threads: int | None = None  # None: compile.ahead_threads() picks
    tune: bool = False
    cuda_pdl: bool = True
    native: str = "auto"

    @classmethod
    def read(cls, environ=None) -> Env:
        environ = os.environ if environ is None else environ
        values = {}
        for k in KNOBS:
            raw = environ.get(k.name)
            if raw not in (None, ""):
                values[k.field] = k.parse(k.name, raw)
        return cls(**values)


@dataclasses.dataclass(frozen=True)
class Options(_HashedOnce):
    """Developer overrides of the own kernel sets' choices: typed, validated, part of every plan's cache key.

    None (False) everywhere is the default plan; a field that is set forces that choice where it applies and
    raises Unsupported (with the reason) where the problem cannot take it."""

    __hash__ = _HashedOnce.__hash__

    algorithm: str | None = None  # the kernel family: ALGORITHMS
    igemm_tile: str | None = None  # the CUDA/HIP tensor-core tile of every implicit-GEMM launch: TC_TILES
    opencl_dense: str | None = None  # overrides PORTCONV_OPENCL_DENSE
    opencl_tc: str | None = None  # overrides PORTCONV_OPENCL_TC
    index64: bool = False  # 64-bit index variants of every kernel (tests: real problems need 2^31 elements)

    def __post_init__(self):
        for name, allowed in (("algorithm", ALGORITHMS), ("igemm_tile", TC_TILES), ("opencl_dense", OPENCL_DENSE),
                              ("opencl_tc", OPENCL_TC)):
            v = getattr(self, name)
            if v is not None and v not in allowed:
                raise ValueError(f"portconv.options({name}={v!r}): expected one of {', '.join(allowed)}")

    def describe(self) -> str:
        """The fields that are set, as 'name=value' (empty for the default)."""
        return ", ".join(f"{f.name}={getattr(self, f.name)}" for f in dataclasses.fields(self)
                         if getattr(self, f.name) not in (None, False))


DEFAULT_OPTIONS = Options()

_env: Env | None = None
_env_override: contextvars.ContextVar[Env | None] = contextvars.ContextVar("portconv_env", default=None)
_options: contextvars.ContextVar[Options] = contextvars.ContextVar("portconv_options", default=DEFAULT_OPTIONS)
_reload_hooks: list[Callable[[], None]] = []  # caches that hold what the environment decided (plans)


def env() -> Env:
    """The PORTCONV_* environment as read at first use (or by reload()), or a with_env() block's."""
    e = _env_override.get()
    if e is not None:
        return e
    global _env
    if _env is None:
        _env = Env.read()
    return _env


def reload() -> Env:
    """Read the PORTCONV_* environment again (after a change in this process) and drop what it decided."""
    global _env
    _env = Env.read()
    for hook in _reload_hooks:
        hook()
    return _env


@contextlib.contextmanager
def with_env(**fields):
    """Within the block, env() has these fields replaced (e.g. poison=True), whatever the environment says."""
    token = _env_override.set(dataclasses.replace(env(), **fields))
    try:
        yield
    finally:
        _env_override.reset(token)


def options() -> Options:
    """The developer options in force (portconv.options(...) blocks, innermost last)."""
    return _options.get()


@contextlib.contextmanager
def use_options(**fields):
    """portconv.options(...): within the block, plans are made with these Options fields set."""
    token = _options.set(dataclasses.replace(_options.get(), **fields))
    try:
        yield _options.get()
    finally:
        _options.reset(token)


def child_environ(cache_dir: str | None = None, **other: str) -> dict[str, str]:
    """The environment of a child process (a fresh-process measurement): this one's, without PORTCONV_POISON (a NaN
    fill would be timed), with PORTCONV_CACHE_DIR set to ``cache_dir`` when given and the ``other`` variables set."""
    env = dict(os.environ)
    env.pop("PORTCONV_POISON", None)
    if cache_dir is not None:
        env["PORTCONV_CACHE_DIR"] = cache_dir
    env.update(other)
    return env


def raw() -> dict[str, str | None]:
    """Every knob's raw environment value (None when unset), for reports."""
    return {k.name: os.environ.get(k.name) for k in KNOBS}


def default_foreign(name: str, value: str) -> str:
    """Set another library's environment variable for this process unless it is set already (the user's value
    wins); returns the value in force. The one place portconv writes the environment (Note [PoCL work-group
    method], portconv/backends/opencl/runtime.py)."""
    return os.environ.setdefault(name, value)
