"""The tensor-core tile's programs (Note [OpenCL tensor cores]) as the OpenCL compiler builds them: the igemm.cl modules
a dense plan runs (public API: Plan.kernels, each launch's Module), per dtype and result. On NVIDIA (-cl-nv-verbose):
registers per work-item (ptxas), the PTX target, mma.sync count, .local declarations; everywhere: each kernel's
work-group limit and private / local memory. Run on the GPU machine (scripts/gpu/opencl_dense.sh, step ptx); elsewhere
it builds the portable products on the device PORTCONV_OPENCL_DEVICE names."""
import re

import pyopencl as cl
import torch

import portconv
from portconv import sources
from portconv.backends.opencl.runtime import build_options

ROWS = {  # a 3x3 layer of ResNet-50 and a 1x1 one: (input, weight, padding)
    "3x3": ((32, 64, 56, 56), (64, 64, 3, 3), 1),
    "1x1": ((32, 256, 56, 56), (64, 256, 1, 1), 0),
}


def modules(xs, ws, pad, dtype):
    """(device, {Module: the results that run it}) of the plan on the opencl backend, tensor cores forced on."""
    x, w = torch.empty(xs, dtype=dtype), torch.empty(ws, dtype=dtype)
    device = portconv.plan(x, w, padding=pad, backend="opencl").device
    with portconv.options(opencl_tc="ptx" if device.vendor == "nvidia" else "portable", opencl_dense="igemm"):
        plan = portconv.plan(x, w, padding=pad, backend="opencl")
    out: dict = {}
    for k in plan.kernels:
        for launch in k.launches:
            if launch.module.source == "igemm.cl":
                out.setdefault(launch.module, []).append(k.result)
    return plan.device, out


def main() -> None:
    info = cl.kernel_work_group_info
    for name, (xs, ws, pad) in ROWS.items():
        for dtype in (torch.float32, torch.float16, torch.bfloat16):
            device, mods = modules(xs, ws, pad, dtype)
            p, d = map(int, device.index.split(":")[1:])
            dev = cl.get_platforms()[p].get_devices()[d]
            ctx, nvidia = cl.Context([dev]), device.vendor == "nvidia"
            for module, results in mods.items():
                opts = build_options(module) + (["-cl-nv-verbose"] if nvidia else [])
                prg = cl.Program(ctx, sources.read("opencl", module.source)).build(options=opts)
                print(f"{name} {str(dtype)[6:]} {'/'.join(dict.fromkeys(results))}: {module.describe()}")
                if nvidia:
                    log = prg.get_build_info(dev, cl.program_build_info.LOG)
                    ptx = prg.get_info(cl.program_info.BINARIES)[0].decode(errors="replace")
                    print("   mma.sync", ptx.count("mma.sync"), ".local decls", len(re.findall(r"\.local\s", ptx)),
                          [ln for ln in ptx.splitlines() if ln.startswith(".target")])
                    ptxas = [ln.strip() for ln in log.splitlines() if "registers" in ln or "spill" in ln]
                    print("   ptxas:", " | ".join(ptxas)[:900])
                for kn in prg.all_kernels():
                    print("  ", kn.function_name, "wg", kn.get_work_group_info(info.WORK_GROUP_SIZE, dev), "private",
                          kn.get_work_group_info(info.PRIVATE_MEM_SIZE, dev), "local",
                          kn.get_work_group_info(info.LOCAL_MEM_SIZE, dev))


if __name__ == "__main__":
    main()
