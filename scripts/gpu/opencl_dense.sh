#!/usr/bin/env bash
# Issue 5 target 4 evidence: the OpenCL set's implicit-GEMM kernels (opencl/igemm.cl) on the NVIDIA GPU through
# NVIDIA's OpenCL ICD, against cuDNN, in one device call of < 8 minutes. Carry .whl (the pyopencl wheels):
#   run(command="bash scripts/gpu/opencl_dense.sh", carry=[".whl"])
# Steps (each capped; everything lands in $OUT, a summary on stdout):
#   1. env: GPU, driver, torch/cuDNN, pyopencl, the OpenCL platforms; `portconv explain` of the dense rows (opencl)
#   2. correctness on the GPU: tests/test_conformance.py --backend opencl (CI grid, float32/float64) and the igemm
#      tests of tests/test_opencl.py (edge shapes, tile shapes, selection, forced-direct path)
#   3. bench, default tile (igemm 64x64x16, 4x4 per work-item): the 17 dense suite rows, opencl + cudnn + torch
#      -> $OUT/ocl/bench.{json,md}; then the per-direction geomean of cudnn_ms / opencl_ms (the target's number)
#   4. the same rows, opencl only, with other tiles (TILES, default "128,64,16,8,4 128,128,8,8,8": BM,BN,BK,TM,TN)
#      -> $OUT/ocl-<tile>/ and the geomean of tile_ms / default_ms per direction (< 1: that tile is faster)
#   5. the direct kernels (PORTCONV_OPENCL_DENSE=direct) on 6 rows -> $OUT/ocl-direct ("before")
#   6. ptx: the tensor-core tile's programs (Note [OpenCL tensor cores]) per dtype: private / local memory, work-group
#      size, mma count and local-memory (spill) declarations in NVIDIA's PTX -> $OUT/ptx.txt (scripts/gpu/ocl_tc_ptx.py)
#   7. fma: the same bench with PORTCONV_OPENCL_TC=off (the FMA tiles) -> $OUT/ocl-fma/, geomean fma_ms / default_ms
#   8. tctile: the bench, opencl only, once per tensor-core tile of TC_TILES ("BM,BN,BK,WM,WN[,REGS] ...", TC_TILE patched in
#      that process) -> $OUT/tc-<tile>/, geomean per direction of tile_ms / default_ms (< 1: that tile is faster)
#   9. patch: the bench, opencl only, once per NAME of PATCHES, in a process where the python of $PATCH_NAME (`g` =
#      _cl_igemm) ran first -> $OUT/NAME-0/, geomean per direction of its medians over the default's
# CONFORM_DTYPES (default "float32 float16 bfloat16") are the conformance step's dtypes (CONFORM_S=0: none), TEST_K
# the -k filter of its tests/test_opencl.py run.
# STEPS="env test bench tile direct" (default: all) picks steps; ROWS overrides the row list; BENCH_ARGS is added to
# every bench (a dry run on a CPU-only machine: PORTCONV_OPENCL_DEVICE=cpu BENCH_ARGS="--device cpu --scale-batch 1").
set -uo pipefail
OUT=${OUT:-out}; mkdir -p "$OUT"
steps=" ${STEPS:-env test bench tile direct} "
has() { [[ "$steps" == *" $1 "* ]]; }
export PYTHONUNBUFFERED=1 PORTCONV_CACHE_DIR=/tmp/portconv-cache
python3 -c "import pyopencl" 2>/dev/null || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --find-links .whl --target /tmp/pyo \
  pyopencl pytools platformdirs siphash24 typing_extensions || exit 1
export PYTHONPATH="$PWD:/tmp/pyo"
mkdir -p /tmp/icd && echo libnvidia-opencl.so.1 > /tmp/icd/nvidia.icd
cp /etc/OpenCL/vendors/pocl.icd /tmp/icd/ 2>/dev/null; export OCL_ICD_VENDORS=/tmp/icd
export PORTCONV_OPENCL_DEVICE=${PORTCONV_OPENCL_DEVICE:-gpu}
DENSE='resnet50-stem,resnet50-l1-3x3,resnet50-l1-3x3-bf16-cl,resnet50-l3-3x3,resnet50-1x1-expand,resnet50-1x1-reduce,'\
'resnet50-1x1-downsample,deepbench-b1-3x3,mbv2-pw-project,resnext50-g32,deeplabv3-aspp-d12,dcgan-gen-transposed,'\
'vae-dec-transposed-bf16,deepbench-speech-c1,wav2vec2-conv1d,wav2vec2-posconv-g16,r3d18-l1-3d'
ROWS=${ROWS:-$DENSE}
BENCH="python3 -m portconv.bench --rows $ROWS --backend opencl,cudnn --cell-seconds 1 --runs 20 --no-torch-variants ${BENCH_ARGS:-}"
# the per-direction geomean of cudnn / opencl medians (> 1: opencl faster) over the rows both ran
ratio() {
  python3 - "$1" <<'EOF'
import json, math, sys
rep = json.load(open(sys.argv[1]))
print(f"{sys.argv[1]}: cudnn_ms / opencl_ms (target 4: geomean >= 0.5)")
for d in ("fwd", "bwd-data", "bwd-weight"):
    rs = []
    for row in rep["rows"]:
        res = row["results"]
        try:
            o, c = res["opencl"]["directions"][d]["median_ms"], res["cudnn"]["directions"][d]["median_ms"]
        except (KeyError, TypeError):
            continue
        if o and c:
            rs.append(c / o)
            print(f"  {row['name']:28s} {d:10s} opencl {o:9.3f} ms  cudnn {c:8.3f} ms  ratio {c / o:.3f}")
    if rs:
        print(f"  geomean {d}: {math.exp(sum(map(math.log, rs)) / len(rs)):.3f} over {len(rs)} rows")
EOF
}
if has env; then
  { date -u; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
    python3 -c "import torch, pyopencl as cl; print('torch', torch.__version__, 'cudnn', torch.backends.cudnn.version(), \
'pyopencl', cl.VERSION_TEXT); print([(p.name, p.version, [d.name for d in p.get_devices()]) for p in cl.get_platforms()])"
    timeout 20 python3 -m portconv.cli explain --suite portconv/bench/suite.json --backend opencl
  } > "$OUT/env.txt" 2>&1; head -8 "$OUT/env.txt"; grep -m3 -i "algorithm" "$OUT/env.txt"
fi
if has test; then
  [ "${CONFORM_S:-150}" != 0 ] && PORTCONV_POISON=1 timeout ${CONFORM_S:-150} python3 -m pytest -q -p no:cacheprovider tests/test_conformance.py \
    --backend opencl $(for d in ${CONFORM_DTYPES:-float32 float16 bfloat16}; do echo --dtype $d; done) \
    > "$OUT/conformance-opencl-gpu.txt" 2>&1; echo "== conformance (opencl on the GPU) rc=$?"
  tail -2 "$OUT/conformance-opencl-gpu.txt"
  timeout ${TEST_S:-60} python3 -m pytest -q -p no:cacheprovider tests/test_opencl.py -k "${TEST_K:-igemm or forced_direct or against or tensor_core}" \
    > "$OUT/test-opencl-gpu.txt" 2>&1; echo "== tests/test_opencl.py igemm tests on the GPU rc=$?"
  grep -E "^(FAILED|ERROR)" "$OUT/test-opencl-gpu.txt" | cut -c1-200 | head -8; tail -1 "$OUT/test-opencl-gpu.txt"
fi
if has bench; then
  timeout ${BENCH_S:-140} $BENCH --out "$OUT/ocl" > "$OUT/bench-ocl.txt" 2>&1; echo "== bench igemm 64x64 rc=$?"
  ratio "$OUT/ocl/bench.json" | tee "$OUT/ratio-ocl.txt"
fi
# bench_tile NAME PATCH TILE: the bench, opencl only, in a process where PATCH (python, `g` = _cl_igemm, `t` = the TILE's
# integers) replaced a default tile -> $OUT/NAME-TILE/, then per direction this tile's medians over the default's
tile_bench() {
  timeout ${TILE_S:-65} python3 -c "import sys; from portconv.backends import _cl_igemm as g
t = list(map(int, sys.argv[1].split(',')))
$2
from portconv.bench.cli import standalone; sys.exit(standalone(sys.argv[2:]))" "$3" \
    --rows "$ROWS" --backend opencl --cell-seconds 0.5 --runs 20 --no-torch-variants ${BENCH_ARGS:-} --out "$OUT/$1-$3" \
    > "$OUT/bench-$1-$3.txt" 2>&1; echo "== bench $1 tile $3 rc=$?"
  python3 scripts/gpu/ocl_compare.py "$OUT/$1-$3/bench.json" "$OUT/ocl/bench.json" "this tile ms / default ms"
}
for tile in ${TILES:-128,64,16,8,4 128,128,8,8,8}; do  # step tile: GPU_TILE (FMA) patched
  has tile || break
  tile_bench ocl "g.GPU_TILE = g.IgSpec(*t)" "$tile"
done
for tile in ${TC_TILES:-}; do  # step tctile: TC_TILE patched
  has tctile || break
  tile_bench tc "g.TC_TILE = g.IgSpec(*t[:3], 0, 0, tc='ptx', wm=t[3], wn=t[4], regs=(t + [0])[5])" "$tile"
done
for name in ${PATCHES:-}; do  # step patch: the bench, opencl only, with the python of $PATCH_<name> applied (g, t=[0])
  has patch || break
  var="PATCH_$name"; tile_bench "$name" "${!var}" 0
done
if has direct; then  # the direct kernels (before igemm) on a few rows, opencl only
  PORTCONV_OPENCL_DENSE=direct timeout 60 python3 -m portconv.bench --backend opencl --cell-seconds 1 --runs 10 \
    --min-runs 3 --no-torch-variants ${BENCH_ARGS:-} --out "$OUT/ocl-direct" \
    --rows resnet50-l1-3x3,resnet50-l3-3x3,resnet50-1x1-expand,deepbench-b1-3x3,wav2vec2-conv1d,dcgan-gen-transposed \
    > "$OUT/bench-ocl-direct.txt" 2>&1; echo "== bench direct rc=$?"
  grep -A3 "floor (ms" "$OUT/bench-ocl-direct.txt" | grep -E "^ *opencl" | head -8
fi
