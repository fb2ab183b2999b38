"""The hip backend: portconv's HIP kernel set (hip/*.hip) by hiprtc on AMD GPUs, or by NVRTC on NVIDIA GPUs."""
from __future__ import annotations

import dataclasses
import os
import pathlib
import re

from ... import sources
from ...device import Availability, DeviceInfo
from ...errors import BackendUnavailable, Unsupported, VendorImportError
from ...knobs import Options
from ...problem import Problem
from .. import BackendId, Choice
from . import base, compile, nvidia, runtime

PIP_HINT = ("pip install portconv[rocm]  (CuPy for ROCm 7: AMD GPUs; on NVIDIA GPUs the HIP sources run through "
            "hip/prelude_nvidia.h with NVRTC and need no CuPy but for CuPy arrays: portconv[cuda12] / [cuda13])")

# Note [HIP modes]: the hip/ sources compile two ways. On a ROCm machine (CuPy for ROCm, torch.version.hip set)
# hiprtc builds them for the device's gfx target with WAVE_SIZE from its wavefront. On an NVIDIA machine NVRTC
# builds the very same files, whose prelude maps HIP's names onto CUDA the way HIP's nvidia platform does; that
# is how the HIP set is executed here, where no AMD GPU exists. The plan's reason names the mode.
MODULES = {"direct": "direct.hip", "depthwise": "depthwise.hip", "implicit_gemm": "igemm.hip"}
_DW = ("fwd_rows", "fwd_rows3s1", "fwd_rows3s2", "fwd_planes", "fwd_tile_s1", "fwd_tile_s2", "fwd_tilen_s1",
       "fwd_tilen_s2", "fwd_tile3d_s1", "fwd_tile3d_s2", "fwd_tilen3d_s1", "fwd_tilen3d_s2",
       "bwd_data_rows", "bwd_data_rows3s1", "bwd_data_rows3s2", "bwd_data_planes", "bwd_data_tile_s1",
       "bwd_data_tilen_s1", "bwd_data_tile3d_s1", "bwd_data_tilen3d_s1",
       "bwd_weight", "bwd_weight_rows2d_s1", "bwd_weight_rows2d_s2", "bwd_weight_rows3d_s1", "bwd_weight_rows3d_s2",
       "bwd_weight_tile2d_s1", "bwd_weight_tile2d_s2", "bwd_weight_tile3d_s1", "bwd_weight_tile3d_s2")
KERNELS = {  # every kernel the selection may launch from each module (select.py, depthwise.py, igemm.py)
    "direct": ("portconv_direct_fwd", "portconv_direct_bwd_data", "portconv_direct_bwd_weight"),
    "depthwise": tuple(f"portconv_depthwise_{k}" for k in _DW),
    "implicit_gemm": ("portconv_igemm_fwd", "portconv_igemm_bwd_data", "portconv_igemm_bwd_weight",
                      "portconv_igemm_col", "portconv_col2im"),  # Note [narrow backward-data] (cuda/conv_igemm.cuh)
}
COMMON_KERNELS = ("portconv_bias_grad", "portconv_split_finalize")  # every module has them (reduce.cuh)
DEFINE_SETS = tuple({"PC_DTYPE": d, "PC_INDEX64": i} for d in (0, 1, 2, 3) for i in (0, 1))  # the base defines
_GFX = re.compile(r"gfx(?:(\d+)[0-9a-f]{2}|(\d+)(?:-\d+)*-generic)$")  # gfx90a, gfx1100, gfx10-3-generic


def wave_of(arch: str) -> int:
    """Wavefront size HIP code gets on a gfx target: 64 on GCN/CDNA (gfx9xx), 32 on RDNA (gfx10xx and newer)."""
    m = _GFX.match(arch.split(":")[0])
    if not m:
        raise Unsupported(f"{arch!r} is not an AMD gfx target")
    return 64 if int(m.group(1) or m.group(2)) <= 9 else 32


def compile_options(platform: str, wave: int, hip_version: int | None = None) -> tuple[str, ...]:
    """The options every hip/ module is compiled with (scripts/hip_build.py uses them for hipcc and hiprtc)."""
    if platform == "amd":
        opts = ("-O3", "-std=c++17", f"-DWAVE_SIZE={wave}")
        return opts + ((f"-DPC_HIP_VERSION={hip_version}",) if hip_version else ())
    if platform == "nvidia":
        return ("-std=c++17", "-DPC_HIP_ON_NVIDIA=1", f"-DWAVE_SIZE={wave}")
    raise ValueError(f"platform must be 'amd' or 'nvidia', not {platform!r}")


def mode(device: DeviceInfo) -> str:
    """Note [HIP modes]: how the hip/ sources compile for ``device``; raises Unsupported on other vendors."""
    if device.vendor == "amd":
        return f"hiprtc on {device.arch} (wave{device.wavefront or wave_of(device.arch)})"
    if device.vendor == "nvidia":
        return f"HIP-on-NVIDIA via the prelude (NVRTC on {device.arch}, wave32)"
    raise Unsupported(f"the hip backend runs on AMD GPUs (and NVIDIA GPUs through its prelude), not "
                      f"{device.vendor} ({device.name})")


class HipKernelSet(compile.KernelSet):
    """hip/ entry files over the shared bodies of cuda/, compiled by NVRTC on NVIDIA through hip/prelude_nvidia.h
    (the simt set's ctypes toolchain, Note [ctypes toolchain]); RocmKernelSet is the AMD one."""

    platform = "nvidia"
    compiler = "nvrtc"

    def __init__(self, wave: int | None = None):
        super().__init__(folders=[sources.folder("hip"), sources.folder("cuda")], options=(), pip_hint=PIP_HINT)
        self.wave = wave  # None: the device's own wavefront (AMD) or 32 (NVIDIA)
        self.vendor = f"hip-{self.platform}"

    def arch_options(self, device: int) -> tuple[str, tuple[str, ...], str]:
        arch, opts, kind = super().arch_options(device)
        return arch, compile_options("nvidia", self.wave or 32) + opts, kind


class RocmKernelSet(HipKernelSet):
    """The hip set on AMD: hiprtc and the HIP runtime through CuPy for ROCm (its cupy.cuda.nvrtc is hiprtc)."""

    platform = "amd"
    compiler = "hiprtc"
    ahead = False  # Note [compile ahead]: concurrent hiprtc compiles never ran here

    def arch_options(self, device: int) -> tuple[str, tuple[str, ...], str]:
        cupy = compile.import_cupy(self.pip_hint)
        props = cupy.cuda.runtime.getDeviceProperties(device)
        target = props["gcnArchName"]
        target = target.decode() if isinstance(target, bytes) else str(target)
        wave = self.wave or int(props.get("warpSize", 0)) or wave_of(target)
        opts = compile_options("amd", wave, int(cupy.cuda.runtime.runtimeGetVersion()))
        return target, opts + (f"--offload-arch={target}", *_rocm_includes()), "hsaco"  # getPTX returns the code

    def compiler_version(self) -> str:
        return ".".join(map(str, compile.import_cupy(self.pip_hint).cuda.nvrtc.getVersion()))

    def build(self, text: str, name: str, options: tuple[str, ...], kind: str) -> bytes:
        rtc = compile.import_cupy(self.pip_hint).cuda.nvrtc
        prog = rtc.createProgram(text, name, [], [])
        try:
            try:
                rtc.compileProgram(prog, list(options))
            except rtc.NVRTCError as e:
                log = rtc.getProgramLog(prog)
                raise RuntimeError(f"{self.compiler} failed to compile {name} {' '.join(options)}:\n{log}") from e
            return rtc.getPTX(prog) + b"\0"
        finally:
            rtc.destroyProgram(prog)

    def load_binary(self, binary: bytes, device: int):
        cupy = compile.import_cupy(self.pip_hint)
        with cupy.cuda.Device(device):
            mod = cupy.cuda.function.Module()
            mod.load(binary)
        return mod


def kernel_set(platform: str, wave: int | None = None) -> HipKernelSet:
    """The hip set of a platform ('amd' or 'nvidia')."""
    return (RocmKernelSet if platform == "amd" else HipKernelSet)(wave)


def _rocm_includes() -> tuple[str, ...]:
    """-I of the ROCm headers, so hiprtc finds <hip/hip_version.h> as it does for CuPy's own kernels (ROCM_PATH and
    HIP_PATH are ROCm's own variables, not portconv knobs)."""
    for root in (os.environ.get("ROCM_PATH"), os.environ.get("HIP_PATH"), "/opt/rocm"):
        if root and (pathlib.Path(root) / "include" / "hip" / "hip_version.h").is_file():
            return (f"-I{pathlib.Path(root) / 'include'}",)
    return ()


class HipBackend(base.SimtBackend):
    """portconv's HIP kernels: the simt set's selection and programs over the hip/ entry files."""

    id = BackendId.HIP
    pip_hint = PIP_HINT
    kernel_set_name = "HIP"
    entries = MODULES
    dependent_waits = False  # hip/prelude_hip.h: pc_grid_dependency_wait does nothing, launches stay ordered

    def __init__(self, wave: int | None = None):
        super().__init__()
        self.wave = wave  # tests force a logical wave (16 on NVIDIA) to run the wave-size-generic paths

    def platform(self) -> str:
        """'amd' where torch is built for ROCm or CuPy is (CuPy imported only where torch has no GPU), else 'nvidia'
        (Note [ctypes toolchain]: NVIDIA needs no CuPy)."""
        return compile.platform(self.pip_hint)

    def kernels(self) -> HipKernelSet:
        if self._kernels is None:
            self._kernels = kernel_set(self.platform(), self.wave)
        return self._kernels

    def probe(self) -> Availability:
        try:
            amd = self.platform() == "amd"
        except (VendorImportError, BackendUnavailable) as e:  # BackendUnavailable: a forked child (Note [fork])
            return Availability.no(str(e))
        if not amd:
            ok, text = nvidia.availability()
            if not ok:  # neither an NVIDIA GPU nor, as far as torch and CuPy tell, an AMD one
                return Availability.no(f"{text}; for AMD GPUs: {PIP_HINT}")
            return Availability.yes(f"HIP-on-NVIDIA: {text}; the hip/ sources compile through hip/prelude_nvidia.h")
        try:
            cupy = compile.import_cupy(self.pip_hint)
            n = cupy.cuda.runtime.getDeviceCount()
            rtc = ".".join(map(str, cupy.cuda.nvrtc.getVersion()))
        except (VendorImportError, BackendUnavailable) as e:
            return Availability.no(str(e))
        except RuntimeError as e:  # CuPy's CUDARuntimeError is one
            return Availability.no(f"no usable ROCm device or runtime: {e}")
        if n == 0:
            return Availability.no("ROCm reports no device")
        return Availability.yes(f"CuPy {cupy.__version__} for ROCm, hiprtc {rtc}, {n} AMD GPU(s)")

    def device_for(self, problem: Problem) -> DeviceInfo:
        base.gpu_tensors(problem, "HIP", "GPU tensors (ROCm or CUDA torch tensors, CuPy arrays)")
        spec = problem.input
        amd = self.platform() == "amd"
        if spec.kind == "cupy":
            return runtime.device_info("cupy", spec.device_index or 0)
        import torch

        torch_hip = bool(getattr(torch.version, "hip", None))
        if torch_hip != amd:
            raise Unsupported(f"PyTorch is built for {'ROCm' if torch_hip else 'CUDA'} but the GPU runtime here is "
                              f"{'ROCm' if amd else 'CUDA'}'s: the tensors' memory is not its device's")
        return runtime.device_info("torch", spec.device_index or 0)

    def choose(self, problem: Problem, device: DeviceInfo, options: Options) -> Choice:
        """The simt set's family rule (no tensor cores), on an AMD GPU or in HIP-on-NVIDIA mode; the mode is the
        reason's first part."""
        how = mode(device)
        c = self.choose_for(problem, device, options)
        return dataclasses.replace(c, reason=f"{how}; {c.reason}")
