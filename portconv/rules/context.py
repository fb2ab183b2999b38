"""TorchContext: every global fact PyTorch's convolution backend selection reads, as frozen data."""
from __future__ import annotations

import dataclasses
import functools
import os
import platform
import sys

from .precision import conv_tf32

# MI-series (CDNA) architectures that get NHWC by default under the arch-gated ROCm rule.
MIOPEN_NHWC_DEFAULT_ARCHS = ("gfx90a", "gfx942", "gfx950")


def check_env(value: str | None) -> bool | None:
    """c10::utils::check_env: '1' -> True, '0' -> False, unset or anything else -> None (torch warns and ignores)."""
    if value == "1":
        return True
    if value == "0":
        return False
    return None


# Note [MIOpen NHWC default]
# Upstream torch 2.13 (aten/src/ATen/native/ConvUtils.h as installed with the 2.13.0 wheel) reads
#     enabled &= c10::utils::check_env("PYTORCH_MIOPEN_SUGGEST_NHWC").value_or(false);
# so MIOpen gets NHWC only when the variable is "1". The ROCm fork (ROCm/pytorch, ConvUtils.h at commit
# 3539e1d233cc445a86dbb07c99d6a7da3d97d845) instead reads
#     bool is_miopen_3_5 = miopen_version >= 30500;  // ROCm 7.0
#     bool suggest_nhwc = c10::utils::check_env("PYTORCH_MIOPEN_SUGGEST_NHWC").value_or(is_miopen_3_5);
# i.e. NHWC by default from MIOpen 3.5 on every arch. After consumer RDNA cards regressed (pytorch/pytorch
# issue 170764), pytorch/pytorch PR 170947 ("[ROCm] Only enable NHWC by default for MI series GPUs", closed)
# gates that default on gcnArchName in {gfx90a, gfx942, gfx950}; no stored ROCm/pytorch ConvUtils.h with that
# gate could be read here, so which ROCm wheels carry it is not known. The three behaviours are the `rule`
# argument below ('rocm-fork-mi' is the arch-gated one); TorchContext stores only the resulting default, and
# from_torch measures it on the real device when it can (see _probe_miopen_nhwc_default).
def miopen_nhwc_default(rule: str, miopen_version: int | None, arch: str) -> bool:
    """What PYTORCH_MIOPEN_SUGGEST_NHWC defaults to: rule 'upstream', 'rocm-fork' or 'rocm-fork-mi'."""
    if rule == "upstream":
        return False
    if rule not in ("rocm-fork", "rocm-fork-mi"):
        raise ValueError(f"unknown MIOpen NHWC rule {rule!r}; known: upstream, rocm-fork, rocm-fork-mi")
    if (miopen_version or 0) < 30500:
        return False
    return rule == "rocm-fork" or arch.split(":")[0] in MIOPEN_NHWC_DEFAULT_ARCHS


@dataclasses.dataclass(frozen=True)
class CpuFacts:
    """What ATen's oneDNN rule reads of the CPU build and flags (read cheaply: portconv.validate needs it per call)."""

    available: bool = True  # AT_MKLDNN_ENABLED()
    enabled: bool = True  # torch.backends.mkldnn.enabled
    bf16: bool = False  # mkldnn_bf16_device_check()
    fp16: bool = False  # mkldnn_fp16_device_check()
    threads: int = 1  # at::get_num_threads()

    @classmethod
    def from_torch(cls) -> CpuFacts:
        """Read from torch if the caller already imported it (the defaults otherwise)."""
        torch = sys.modules.get("torch")
        if torch is None:
            return cls()
        bf16, fp16 = _mkldnn_lowp(torch)
        return cls(bool(torch.backends.mkldnn.is_available()), bool(torch._C._get_mkldnn_enabled()), bf16, fp16,
                   torch.get_num_threads())


@functools.cache
def _mkldnn_lowp(torch) -> tuple[bool, bool]:
    return _mkldnn_check(torch, "_is_mkldnn_bf16_supported"), _mkldnn_check(torch, "_is_mkldnn_fp16_supported")


@dataclasses.dataclass(frozen=True)
class TorchContext:
    """The build, runtime flags and device facts ATen's Convolution.cpp / ConvUtils.h consult.

    Defaults describe a CPU-only x86 build of torch 2.13 with oneDNN and NNPACK, all flags at their defaults.
    Fields marked "carried" are read into ConvParams by ATen but decide nothing in 2.13's selection.
    """

    device_type: str = "cpu"  # the device the context was read for (selection looks at each tensor's own device)
    torch_version: str = "2.13.0"
    # --- CUDA / ROCm build and cuDNN / MIOpen ---------------------------------------------------------------
    has_cudnn: bool = False  # compiledWithCuDNN(): a CUDA build with cuDNN (False on ROCm)
    is_hip: bool = False  # compiledWithMIOpen(): a ROCm build
    cudnn_enabled: bool = True  # torch.backends.cudnn.enabled (userEnabledCuDNN; gates MIOpen too on ROCm)
    cudnn_version: int | None = None  # versionRuntimeCuDNN(), e.g. 91002 for 9.10.2
    cudnn_v8_api: bool = True  # not TORCH_CUDNN_V8_API_DISABLED=1 (cudnnv8_enabled_check_debug)
    cudnn_depthwise_kernel: str = "auto"  # torch.backends.cudnn.depthwise_kernel: 'auto', 'native', 'cudnn'
    deterministic: bool = False  # carried: cudnn.deterministic or use_deterministic_algorithms
    benchmark: bool = False  # carried: torch.backends.cudnn.benchmark
    allow_tf32: bool = True  # carried: torch.backends.cudnn.allow_tf32
    gpu_arch: str = ""  # the *current* CUDA device: 'sm_90' or, on ROCm, 'gfx942'
    miopen_version: int | None = None  # versionMIOpen(): major*10000 + minor*100 + patch (3.5.0 -> 30500)
    miopen_suggest_nhwc: str | None = None  # the PYTORCH_MIOPEN_SUGGEST_NHWC environment value
    miopen_nhwc_default: bool = False  # what that variable defaults to in this build (Note [MIOpen NHWC default])
    miopen_64bit_indexing: bool = True  # 2.13 lets MIOpen take 64-bit problems (miopenSetTensorDescriptorV2)
    # --- CPU ------------------------------------------------------------------------------------------------
    mkldnn_available: bool = True  # AT_MKLDNN_ENABLED()
    mkldnn_enabled: bool = True  # torch.backends.mkldnn.enabled (userEnabledMkldnn)
    mkldnn_bf16: bool = False  # mkldnn_bf16_device_check() (avx512bf16/avx_ne_convert, or ARM bf16)
    mkldnn_fp16: bool = False  # mkldnn_fp16_device_check() (avx512fp16/avx_ne_convert)
    nnpack_available: bool = True  # at::_nnpack_available()
    nnpack_enabled: bool = True  # torch.backends.nnpack.enabled (userEnabledNNPACK)
    num_threads: int = 1  # at::get_num_threads()
    cpu_capability: str = ""  # informational: torch.backends.cpu.get_cpu_capability()
    cpu_winograd: bool = False  # built with __ARM_NEON__ or RISC-V vectors: the 3x3 depthwise Winograd kernel
    mobile_build: bool = False  # C10_MOBILE: XNNPACK convolution, no cuDNN/MIOpen, memory format always contiguous
    xnnpack_available: bool = False  # xnnpack::available() (mobile builds only reach it)
    # --- other devices --------------------------------------------------------------------------------------
    mps_built: bool = False  # USE_MPS
    mps_conv3d_long_index: bool = False  # later MPS builds run 64-bit-index conv3d forward (PR 188802)
    grad_enabled: bool = True  # GradMode::is_enabled()

    def __post_init__(self):
        if self.cudnn_depthwise_kernel not in ("auto", "native", "cudnn"):
            raise ValueError(f"cudnn_depthwise_kernel must be 'auto', 'native' or 'cudnn', "
                             f"not {self.cudnn_depthwise_kernel!r}")
        if self.has_cudnn and self.is_hip:
            raise ValueError("a build is either CUDA with cuDNN or ROCm with MIOpen, not both")

    @property
    def sm_major(self) -> int:
        """Compute-capability major of an 'sm_XY' arch (0 when unknown or not NVIDIA)."""
        if self.gpu_arch.startswith("sm_") and len(self.gpu_arch) >= 5:
            return int(self.gpu_arch[3:-1])
        return 0

    @property
    def cpu_facts(self) -> CpuFacts:
        return CpuFacts(self.mkldnn_available, self.mkldnn_enabled, self.mkldnn_bf16, self.mkldnn_fp16,
                        self.num_threads)

    @property
    def miopen_nhwc(self) -> bool:
        """check_env("PYTORCH_MIOPEN_SUGGEST_NHWC").value_or(default) of miopen_conv_suggest_memory_format."""
        v = check_env(self.miopen_suggest_nhwc)
        return self.miopen_nhwc_default if v is None else v

    def replace(self, **changes) -> TorchContext:
        return dataclasses.replace(self, **changes)

    @classmethod
    def from_torch(cls, device: str = "cpu") -> TorchContext:
        """Read the running torch's build, flags and (for 'cuda') current device. The only code that reads torch."""
        import torch

        dev = torch.device(device)
        hip = bool(getattr(torch.version, "hip", None))
        has_cudnn = bool(getattr(torch._C, "_has_cudnn", False)) and not hip
        lib_version = None
        if (has_cudnn or hip) and torch.cuda.is_available():
            lib_version = _miopen_version(torch) if hip else torch.backends.cudnn.version()
        arch = ""
        if dev.type == "cuda" and torch.cuda.is_available():  # CPU contexts never initialise CUDA (a forked child)
            props = torch.cuda.get_device_properties(torch.cuda.current_device())
            arch = (getattr(props, "gcnArchName", "") or "").split(":")[0] if hip else f"sm_{props.major}{props.minor}"
        get_kernel = getattr(torch._C, "_get_cudnn_depthwise_kernel", None)
        machine = platform.machine().lower()
        ctx = cls(
            device_type=dev.type,
            torch_version=torch.__version__,
            has_cudnn=has_cudnn,
            is_hip=hip,
            cudnn_enabled=bool(torch.backends.cudnn.enabled),
            cudnn_version=lib_version if has_cudnn else None,
            cudnn_v8_api=check_env(os.environ.get("TORCH_CUDNN_V8_API_DISABLED")) is not True,
            cudnn_depthwise_kernel=get_kernel() if get_kernel else "auto",
            deterministic=bool(torch.backends.cudnn.deterministic or torch.are_deterministic_algorithms_enabled()),
            benchmark=bool(torch.backends.cudnn.benchmark),
            allow_tf32=conv_tf32(torch)[0],
            gpu_arch=arch,
            miopen_version=lib_version if hip else None,
            miopen_suggest_nhwc=os.environ.get("PYTORCH_MIOPEN_SUGGEST_NHWC"),
            mkldnn_available=bool(torch.backends.mkldnn.is_available()),
            mkldnn_enabled=bool(torch._C._get_mkldnn_enabled()),
            mkldnn_bf16=_mkldnn_lowp(torch)[0],
            mkldnn_fp16=_mkldnn_lowp(torch)[1],
            nnpack_available=bool(torch._nnpack_available()),
            nnpack_enabled=bool(torch._C._get_nnpack_enabled()),
            num_threads=torch.get_num_threads(),
            cpu_capability=torch.backends.cpu.get_cpu_capability(),
            # __ARM_NEON__ is predefined by clang on arm64 (macOS wheels) but not by GCC on aarch64 Linux.
            cpu_winograd=machine in ("arm64", "aarch64") and sys.platform == "darwin",
            mps_built=bool(torch.backends.mps.is_built()),
            grad_enabled=torch.is_grad_enabled(),
        )
        if hip:
            ctx = ctx.replace(miopen_nhwc_default=_probe_miopen_nhwc_default(torch, ctx))
        return ctx


def _miopen_version(torch) -> int | None:
    """versionMIOpen() (major*10000 + minor*100 + patch, of the MIOpen torch was built with). Python's
    torch.backends.cudnn.version() on ROCm is the runtime MIOpen as major*1000000 + minor*1000 + patch."""
    compiled = getattr(getattr(torch._C, "_cudnn", None), "getCompileVersion", None)
    if compiled is not None:
        major, minor, patch = compiled()
    else:
        v = torch.backends.cudnn.version()
        if v is None:
            return None
        major, minor, patch = v // 1_000_000, v // 1000 % 1000, v % 1000
    return major * 10000 + minor * 100 + patch


def _mkldnn_check(torch, name: str) -> bool:
    fn = getattr(torch.ops.mkldnn, name, None)
    return bool(fn()) if fn is not None and torch.backends.mkldnn.is_available() else False


def _probe_miopen_nhwc_default(torch, ctx: TorchContext) -> bool:
    """Ask this ROCm build what MIOpen's NHWC default is, when the environment does not override it."""
    if check_env(ctx.miopen_suggest_nhwc) is None and torch.cuda.is_available():
        x = torch.empty(1, 2, 2, 2, device="cuda").to(memory_format=torch.channels_last)
        w = torch.empty(2, 2, 1, 1, device="cuda")
        fmt = torch._C._conv_determine_backend_memory_format(x, w, torch._C._ConvBackend.Miopen)
        return fmt == torch.channels_last
    # Overridden (or no device to ask): infer the rule from the build, as AMD's wheels are versioned '+rocm..git..'.
    rule = "rocm-fork-mi" if ".git" in torch.__version__ else "upstream"
    return miopen_nhwc_default(rule, ctx.miopen_version, ctx.gpu_arch)


def torch_flags(device_type: str) -> tuple:
    """The torch flags that decide ATen's route (and portconv's checks) for tensors on ``device_type``, read in about
    a microsecond (part of every plan's cache key: Note [plan cache]); () before torch is imported."""
    read = _flag_readers.get(device_type)
    if read is None:
        torch = sys.modules.get("torch")
        if torch is None:
            return ()
        read = _flag_readers[device_type] = _flag_reader(torch, device_type)
    return read()


_flag_readers: dict = {}


def _flag_reader(torch, device_type: str):
    """torch_flags' reader for one device type, its getters bound once (this runs on every call's fast path)."""
    c = torch._C
    if device_type != "cuda":
        mkldnn, nnpack, threads = c._get_mkldnn_enabled, c._get_nnpack_enabled, torch.get_num_threads
        return lambda: (mkldnn(), nnpack(), threads())
    enabled, determ, bench = c._get_cudnn_enabled, c._get_cudnn_deterministic, c._get_cudnn_benchmark
    algos = c._get_deterministic_algorithms
    kernel = getattr(c, "_get_cudnn_depthwise_kernel", None) or (lambda: "auto")
    get = getattr(c, "_get_fp32_precision_getter", None)
    if get is None:
        allow = c._get_cudnn_allow_tf32
        return lambda: (enabled(), determ(), bench(), algos(), allow(), kernel())
    return lambda: (enabled(), determ(), bench(), algos(), (get("cuda", "conv"), get("cuda", "all"),
                                                              get("generic", "all")), kernel())
