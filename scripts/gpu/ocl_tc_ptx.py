"""The tensor-core tile's programs (Note [OpenCL tensor cores]) as NVIDIA's OpenCL compiler builds them, per dtype and
tile: registers per work-item (ptxas, from -cl-nv-verbose), the PTX target, mma.sync count, .local declarations, and
per kernel the work-group limit and private / local memory. Run on the GPU machine (scripts/gpu/opencl_dense.sh, step
ptx). PTX_TILES: "BM,BN,BK,WM,WN[,REGS] ..." (default: the default tile)."""
import os
import re

import pyopencl as cl

from portconv import sources
from portconv.backends import _cl_igemm as g
from portconv.backends import _cl_runtime as rt


class _Geo:  # spec() reads only strides and dilations
    S = DL = (1, 1, 1)


dev = [d for p in cl.get_platforms() if "NVIDIA" in p.name for d in p.get_devices()][0]
ctx = cl.Context([dev])
print(dev.name, dev.driver_version)
info = cl.kernel_work_group_info
tiles = [None] + [tuple((list(map(int, t.split(","))) + [0])[:6]) for t in os.environ.get("PTX_TILES", "").split()]
for tile in tiles:
    base = g.TC_TILE if tile is None else g.IgSpec(*tile[:3], 0, 0, tc="ptx", wm=tile[3], wn=tile[4], regs=tile[5])
    for dt in ("float32", "bfloat16") if tile else ("float32", "float16", "bfloat16"):
        g.TC_TILE = base
        sp = g.spec(_Geo(), False, "ptx")
        opts = ["-I", str(sources.folder("opencl")), "-cl-nv-verbose"] + [
            d if d.startswith("-") else f"-D{d}" for d in (rt._DEFINES[dt],) + sp.defines]
        prg = cl.Program(ctx, sources.read("opencl", "igemm.cl")).build(options=opts)
        log = prg.get_build_info(dev, cl.program_build_info.LOG)
        ptx = prg.get_info(cl.program_info.BINARIES)[0].decode(errors="replace")
        print(dt, sp.defines, "mma.sync", ptx.count("mma.sync"), ".local decls", len(re.findall(r"\.local\s", ptx)),
              [ln for ln in ptx.splitlines() if ln.startswith(".target")])
        ptxas = [ln.strip() for ln in log.splitlines() if "registers" in ln or "spill" in ln]
        print("   ptxas:", " | ".join(ptxas)[:900])
        for k in prg.all_kernels():
            print("  ", k.function_name, "wg", k.get_work_group_info(info.WORK_GROUP_SIZE, dev), "private",
                  k.get_work_group_info(info.PRIVATE_MEM_SIZE, dev), "local",
                  k.get_work_group_info(info.LOCAL_MEM_SIZE, dev))
