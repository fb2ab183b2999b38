"""DeviceInfo (the device as data), Availability (a yes/no with its reason) and the one adapter that builds them."""
from __future__ import annotations

import dataclasses
import functools
import platform


@dataclasses.dataclass(frozen=True)
class Availability:
    ok: bool
    reason: str

    def __bool__(self) -> bool:
        return self.ok

    @classmethod
    def yes(cls, reason: str = "available") -> Availability:
        return cls(True, reason)

    @classmethod
    def no(cls, reason: str) -> Availability:
        return cls(False, reason)


@dataclasses.dataclass(frozen=True)
class DeviceInfo:
    """Everything the planner may know of a device. Pure data: rules and selection read only this."""

    vendor: str  # 'nvidia', 'amd', 'intel', 'apple', 'pocl', 'cpu', ...
    kind: str  # 'gpu' or 'cpu'
    name: str
    arch: str = ""  # 'sm_90', 'gfx90a', 'x86_64'
    runtime: str = ""  # 'cuda', 'hip', 'opencl', 'cpu'
    wavefront: int | None = None  # warp / wavefront / preferred sub-group size
    compute_units: int = 0
    memory_bytes: int = 0
    local_mem_bytes: int = 0
    max_work_group: int = 0
    fp64: bool = True
    fp16: bool = False  # native half arithmetic (storage conversion is always possible)
    bf16: bool = False
    versions: tuple[tuple[str, str], ...] = ()  # (component, version) pairs: driver, runtime, torch, cudnn ...
    index: str = ""  # how the adapter finds the device again: 'cuda:0', 'opencl:0:1'

    def version(self, component: str, default: str = "") -> str:
        return dict(self.versions).get(component, default)

    def describe(self, versions: bool = True) -> str:
        wave = f", wave{self.wavefront}" if self.wavefront else ""
        head = f"{self.name} [{self.vendor} {self.kind} {self.arch}{wave}]"
        return f"{head} ({self.describe_versions()})" if versions else head

    def describe_versions(self) -> str:
        return ", ".join(f"{k} {v}" for k, v in self.versions)

    def as_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["versions"] = dict(self.versions)
        return d


# --- the adapter: the only code that reads vendor runtimes to build DeviceInfo -------------------------

def _torch_versions() -> list[tuple[str, str]]:
    import torch

    out = [("torch", torch.__version__)]
    if torch.version.cuda:
        out.append(("cuda", torch.version.cuda))
    if getattr(torch.version, "hip", None):
        out.append(("hip", torch.version.hip))
    try:
        v = torch.backends.cudnn.version()
    except Exception as e:  # noqa: BLE001 - a broken cuDNN install is reported, not hidden
        v = f"error: {e}"
    if v:
        out.append(("miopen" if getattr(torch.version, "hip", None) else "cudnn", str(v)))
    return out


@functools.cache
def torch_cuda(index: int) -> DeviceInfo:
    """from_torch_cuda, read once per device and process."""
    return from_torch_cuda(index)


def from_torch_cuda(index: int) -> DeviceInfo:
    """A CUDA or ROCm device as torch sees it (ROCm reports AMD GPUs as device type 'cuda')."""
    import torch

    p = torch.cuda.get_device_properties(index)
    hip = bool(getattr(torch.version, "hip", None))
    if hip:
        arch = (getattr(p, "gcnArchName", "") or "").split(":")[0]
        vendor, runtime = "amd", "hip"
        wave = int(getattr(p, "warp_size", 64) or 64)
    else:
        arch = f"sm_{p.major}{p.minor}"
        vendor, runtime = "nvidia", "cuda"
        wave = int(getattr(p, "warp_size", 32) or 32)
    versions = _torch_versions()
    try:
        import subprocess

        drv = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader", f"-i={index}"],
                             capture_output=True, text=True, timeout=10).stdout.strip()
        if drv:
            versions.insert(0, ("driver", drv))
    except (OSError, subprocess.SubprocessError):
        pass  # no nvidia-smi: the driver version is simply not known
    return DeviceInfo(vendor=vendor, kind="gpu", name=p.name, arch=arch, runtime=runtime, wavefront=wave,
                      compute_units=p.multi_processor_count, memory_bytes=p.total_memory,
                      local_mem_bytes=int(getattr(p, "shared_memory_per_block", 48 * 1024)),
                      max_work_group=1024, fp64=True, fp16=True, bf16=(hip or p.major >= 8),
                      versions=tuple(versions), index=f"cuda:{index}")


def opencl_devices() -> list[tuple[int, int, object]]:
    """(platform index, device index, pyopencl.Device) for every OpenCL device; raises on ICD errors. The caller
    has pyopencl (the opencl backend imports it with the pip hint; a pyopencl array's owner has it loaded)."""
    import pyopencl as cl

    out = []
    for pi, plat in enumerate(cl.get_platforms()):
        try:
            devs = plat.get_devices()
        except cl.Error as e:  # a platform with no devices raises DEVICE_NOT_FOUND: list it as empty
            if "DEVICE_NOT_FOUND" not in str(e):
                raise
            devs = []
        out += [(pi, di, d) for di, d in enumerate(devs)]
    return out


def opencl_flat_index(dev) -> int:
    """A pyopencl.Device's position in opencl_devices() (TensorSpec.device_index of pyopencl arrays), -1 if absent."""
    return _opencl_positions().get(dev.int_ptr, -1)


@functools.lru_cache(maxsize=1)
def _opencl_positions() -> dict[int, int]:
    return {dev.int_ptr: i for i, (_, _, dev) in enumerate(opencl_devices())}


def from_opencl(dev, platform_index: int, device_index: int) -> DeviceInfo:
    """An OpenCL device (a pyopencl.Device)."""
    import pyopencl as cl

    plat = dev.platform
    pname = plat.name.lower()
    vname = dev.vendor.lower()
    if "portable computing" in pname or "pocl" in pname:
        vendor = "pocl"
    elif "nvidia" in vname:
        vendor = "nvidia"
    elif "advanced micro" in vname or "amd" in vname:
        vendor = "amd"
    elif "intel" in vname:
        vendor = "intel"
    elif "apple" in vname:
        vendor = "apple"
    else:
        vendor = vname.split()[0] if vname else "unknown"
    kind = "gpu" if dev.type & cl.device_type.GPU else "cpu"
    exts = dev.extensions.split()
    wave = None
    if vendor == "nvidia":
        wave = 32
    elif vendor == "amd":  # Mesa's drivers for AMD GPUs lack the AMD query extension: querying it would raise
        wave = int(dev.wavefront_width_amd or 64) if "cl_amd_device_attribute_query" in exts else 64
    arch = platform.machine() if kind == "cpu" else dev.name
    if vendor == "nvidia" and "cl_nv_device_attribute_query" in exts:  # compute capability, as CUDA names it
        arch = f"sm_{dev.compute_capability_major_nv}{dev.compute_capability_minor_nv}"
    versions = (("driver", dev.driver_version), ("opencl", dev.version), ("platform", plat.version),
                ("pyopencl", cl.VERSION_TEXT))
    return DeviceInfo(vendor=vendor, kind=kind, name=dev.name.strip(), arch=arch, runtime="opencl", wavefront=wave,
                      compute_units=dev.max_compute_units, memory_bytes=dev.global_mem_size,
                      local_mem_bytes=dev.local_mem_size, max_work_group=dev.max_work_group_size,
                      fp64="cl_khr_fp64" in exts or dev.double_fp_config != 0, fp16="cl_khr_fp16" in exts,
                      bf16=False, versions=versions, index=f"opencl:{platform_index}:{device_index}")


def host_cpu() -> DeviceInfo:
    return DeviceInfo(vendor="cpu", kind="cpu", name=platform.processor() or platform.machine(),
                      arch=platform.machine(), runtime="cpu", versions=tuple(_torch_versions()), index="cpu")
