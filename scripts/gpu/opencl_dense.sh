#!/usr/bin/env bash
# The OpenCL set's dense kernels (opencl/igemm.cl) on the NVIDIA GPU through NVIDIA's OpenCL ICD, against cuDNN, in one
# device call. Carry .whl (the pyopencl wheels):
#   run(command="bash scripts/gpu/opencl_dense.sh", carry=[".whl"])
# Steps (each capped; everything lands in $OUT, a summary on stdout); only user knobs (PORTCONV_*) and public APIs:
#   env     GPU, driver, torch/cuDNN, pyopencl, the OpenCL platforms; `portconv explain` of the suite (opencl)
#   test    tests/test_conformance.py --backend opencl (CI grid, CONFORM_DTYPES) and the kernel tests of
#           tests/test_opencl_kernels.py (TEST_K) on the GPU
#   bench   the dense suite rows (ROWS), opencl + cudnn -> $OUT/ocl/bench.{json,md}; per direction the geomean of
#           cudnn_ms / opencl_ms
#   fma     the same rows, opencl only, PORTCONV_OPENCL_TC=off (the FMA tiles) -> $OUT/ocl-fma/; geomean fma / default
#   direct  the direct kernels (PORTCONV_OPENCL_DENSE=direct) on 6 rows -> $OUT/ocl-direct/
#   ptx     the tensor-core tile's programs per dtype: registers, mma count, spills, work-group limits -> $OUT/ptx.txt
# STEPS="env test bench" picks steps (default: env test bench fma direct ptx); BENCH_ARGS is added to every bench (a
# dry run on a CPU-only machine: PORTCONV_OPENCL_DEVICE=cpu BENCH_ARGS="--device cpu --scale-batch 1").
set -uo pipefail
OUT=${OUT:-out}; mkdir -p "$OUT"
steps=" ${STEPS:-env test bench fma direct ptx} "
has() { [[ "$steps" == *" $1 "* ]]; }
export PYTHONUNBUFFERED=1 PORTCONV_CACHE_DIR=/tmp/portconv-cache
python3 -c "import pyopencl" 2>/dev/null || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
  --find-links .whl --target /tmp/pyo pyopencl pytools platformdirs siphash24 typing_extensions || exit 1
export PYTHONPATH="$PWD:/tmp/pyo"
mkdir -p /tmp/icd && echo libnvidia-opencl.so.1 > /tmp/icd/nvidia.icd
cp /etc/OpenCL/vendors/pocl.icd /tmp/icd/ 2>/dev/null; export OCL_ICD_VENDORS=/tmp/icd
export PORTCONV_OPENCL_DEVICE=${PORTCONV_OPENCL_DEVICE:-gpu}
DENSE='resnet50-stem,resnet50-l1-3x3,resnet50-l1-3x3-bf16-cl,resnet50-l3-3x3,resnet50-1x1-expand,resnet50-1x1-reduce,'\
'resnet50-1x1-downsample,deepbench-b1-3x3,mbv2-pw-project,resnext50-g32,deeplabv3-aspp-d12,dcgan-gen-transposed,'\
'vae-dec-transposed-bf16,deepbench-speech-c1,wav2vec2-conv1d,wav2vec2-posconv-g16,r3d18-l1-3d'
ROWS=${ROWS:-$DENSE}
BENCH="python3 -m portconv.bench --rows $ROWS --cell-seconds 1 --runs 20 --no-torch-variants ${BENCH_ARGS:-}"
# the per-direction geomean of cudnn / opencl medians (> 1: opencl faster) over the rows both ran
ratio() {
  python3 - "$1" <<'EOF'
import json, math, sys
rep = json.load(open(sys.argv[1]))
print(f"{sys.argv[1]}: cudnn_ms / opencl_ms")
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
  } > "$OUT/env.txt" 2>&1; head -8 "$OUT/env.txt"
fi
if has test; then
  [ "${CONFORM_S:-150}" != 0 ] && PORTCONV_POISON=1 timeout ${CONFORM_S:-150} python3 -m pytest -q -p no:cacheprovider \
    tests/test_conformance.py --backend opencl $(for d in ${CONFORM_DTYPES:-float32 float16 bfloat16}; do echo --dtype $d; done) \
    > "$OUT/conformance-opencl-gpu.txt" 2>&1; echo "== conformance (opencl on the GPU) rc=$?"
  tail -2 "$OUT/conformance-opencl-gpu.txt"
  PORTCONV_POISON=1 timeout ${TEST_S:-90} python3 -m pytest -q -p no:cacheprovider tests/test_opencl_kernels.py \
    -k "${TEST_K:-igemm or forced_direct or tensor_core}" > "$OUT/test-opencl-gpu.txt" 2>&1
  echo "== tests/test_opencl_kernels.py on the GPU rc=$?"
  grep -E "^(FAILED|ERROR)" "$OUT/test-opencl-gpu.txt" | cut -c1-200 | head -8; tail -1 "$OUT/test-opencl-gpu.txt"
fi
if has bench; then
  timeout ${BENCH_S:-140} $BENCH --backend opencl,cudnn --out "$OUT/ocl" > "$OUT/bench-ocl.txt" 2>&1
  echo "== bench rc=$?"; ratio "$OUT/ocl/bench.json" | tee "$OUT/ratio-ocl.txt"
fi
if has fma; then
  PORTCONV_OPENCL_TC=off timeout ${BENCH_S:-140} $BENCH --backend opencl --out "$OUT/ocl-fma" > "$OUT/bench-fma.txt" 2>&1
  echo "== bench FMA tiles rc=$?"
  [ -f "$OUT/ocl/bench.json" ] && python3 scripts/gpu/ocl_compare.py "$OUT/ocl-fma/bench.json" "$OUT/ocl/bench.json" \
    "FMA tiles ms / default ms"
fi
if has direct; then
  PORTCONV_OPENCL_DENSE=direct timeout 60 python3 -m portconv.bench --backend opencl --cell-seconds 1 --runs 10 \
    --min-runs 3 --no-torch-variants ${BENCH_ARGS:-} --out "$OUT/ocl-direct" \
    --rows resnet50-l1-3x3,resnet50-l3-3x3,resnet50-1x1-expand,deepbench-b1-3x3,wav2vec2-conv1d,dcgan-gen-transposed \
    > "$OUT/bench-ocl-direct.txt" 2>&1; echo "== bench direct rc=$?"
  grep -A3 "floor (ms" "$OUT/bench-ocl-direct.txt" | grep -E "^ *opencl" | head -8
fi
if has ptx; then
  timeout 120 python3 scripts/gpu/ocl_tc_ptx.py > "$OUT/ptx.txt" 2>&1; echo "== ptx rc=$?"; grep -m6 "ptxas" "$OUT/ptx.txt"
fi
