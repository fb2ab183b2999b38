#!/usr/bin/env bash
# The GPU evidence, on the device machine (repo root; carry .whl with pyopencl + tox wheels, and .base for 'before').
#   bash scripts/gpu/reports.sh [tox] [json] [explain] [bench] [before]
# grid:    the conformance grid (four dtypes, poisoned) and GPU test file of cuda, hip and opencl side by side
# tox:     tox -e cuda / hip / opencl side by side (whole grid, four dtypes; TOX_ENVS picks them, as env or env:workers,
#          default 3 workers each). Seen on two H200s (32 cores): cuda:12 beside hip:6 and opencl:6 did not finish
#          the cuda env in 530 s (hip 245 s, opencl 386 s); so run the cuda env alone in its call (TOX_ENVS=cuda:24,
#          not yet tried; alone on one H100, -n 5, it took 471 s)
# json:    portconv conform --json per GPU backend (JSON_BACKENDS, default "cuda cudnn hip opencl")
# explain: portconv explain --suite for auto and each GPU backend
# torch:   the torch-integration tests (compile, CUDA graphs, autocast, higher-order AD, convert) on the GPU backends
# overhead: per-call host cost (forward, and forward + backward through autograd) of every backend against PyTorch
# models:  portconv bench --models (training steps, PyTorch against convert(); MODELS_ARGS adds flags, e.g. a subset)
# profile: scripts/gpu/model_profile.py of PROFILE_CELLS (model:dtype:layout ...): GPU time by kernel, both sides
# firstprof: scripts/gpu/first_profile.py, cold then warm, PyTorch and auto (FIRSTPROF_MODEL: 'model dtype')
# hostprof: scripts/gpu/host_profile.py of HOSTPROF_CELLS: host time a step, both sides and depthwise forced to cuda
# longred: portconv conform --long-reductions on cuda, hip and opencl (Note [long reductions])
# fuzz:    portconv conform --fuzz on cuda, hip and opencl, four dtypes, FUZZ_SECONDS each (in parallel)
# pocl:    portconv conform --backend opencl on the machine's own CPU OpenCL (its PoCL, PORTCONV_OPENCL_DEVICE=cpu),
#          float32 and float64: the float64 implicit-GEMM grad_weight defect seen on Debian PoCL 5.0
# first:   portconv bench --models --first-step (fresh processes, cold and warm caches; FIRST_ARGS adds flags)
#          models and first extend /tmp/models/models.json (--resume), so later calls on a warm machine add cells
# bench:   portconv bench of every suite row and backend, held stream (BENCH_ARGS adds flags)
# before:  the same bench of the tree in .base (an older commit's portconv/ and kernels), first, in this call
# Results land in $OUT: reports.tgz (every log and report), bench/ and bench-before/ (json, md, png).
set -uo pipefail
OUT=${OUT:-out}; R=/tmp/reports; mkdir -p "$OUT" "$R"
steps=${*:-tox json explain}
has() { [[ " $steps " == *" $1 "* ]]; }
export PYTHONUNBUFFERED=1 OMP_NUM_THREADS=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  || exit 1
SITE=$(python3 -c 'import site; print(site.getsitepackages()[0])')
export PORTCONV_SITE_PACKAGES="/tmp/site:$SITE" PYTHONPATH="$PWD:/tmp/site"
mkdir -p /tmp/icd && echo libnvidia-opencl.so.1 > /tmp/icd/nvidia.icd
cp /etc/OpenCL/vendors/pocl.icd /tmp/icd/ 2>/dev/null; export OCL_ICD_VENDORS=/tmp/icd
{
  date -u; git log -1 --format='%H %s' 2>/dev/null
  nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv
  python3 -c "import torch, cupy, pyopencl as cl; print('torch', torch.__version__, 'cuda', torch.version.cuda, \
'cudnn', torch.backends.cudnn.version(), 'cupy', cupy.__version__, 'nvrtc', cupy.cuda.nvrtc.getVersion(), \
'pyopencl', cl.VERSION_TEXT); print([(p.name, p.version, [d.name for d in p.get_devices()]) \
for p in cl.get_platforms()])"
  nvcc --version | tail -2
  python3 -m portconv.cli devices
} > "$R/env.txt" 2>&1
head -12 "$R/env.txt"
DT="--dtype float32,float64,float16,bfloat16"
OUT=$(realpath "$OUT")
bench() {  # bench <out folder> <tree to run from> <cache dir>: python -m puts the current folder first on the path
  ( cd "$2" && PORTCONV_CACHE_DIR=$3 PORTCONV_OPENCL_DEVICE=gpu PYTHONPATH="$2:/tmp/site" \
    timeout ${BENCH_TIMEOUT:-280} python3 -m portconv.bench --hold-stream --cell-seconds ${BENCH_CELL_S:-0.5} \
    --backend all ${BENCH_ARGS:-} --out "$OUT/$1" > "$R/$1.txt" 2>&1 )
  echo "== $1 rc=$? ($(cd "$2" && python3 -c "import portconv; print(portconv.__file__)"))"; tail -3 "$R/$1.txt"
}
if has overhead; then
  PORTCONV_OPENCL_DEVICE=gpu timeout 200 python3 -m portconv.bench --rows mbv2-dw3x3-b1 --directions fwd --runs 20 \
    --cell-seconds 1 --no-torch-variants --backend opencl,cuda,hip,cudnn,aten,auto --overhead --out "$OUT/overhead" \
    > "$R/overhead.txt" 2>&1; echo "== overhead rc=$?"; grep -A40 -i "overhead" "$R/overhead.txt" | tail -40
fi
if has profile; then
  timeout ${PROFILE_TIMEOUT:-150} python3 scripts/gpu/model_profile.py ${PROFILE_CELLS:-resnet50:bfloat16:channels_last} \
    > "$R/profile.txt" 2>&1; echo "== profile rc=$?"; grep -v Warning "$R/profile.txt" | tail -80
fi
if has hostprof; then
  timeout ${HOSTPROF_TIMEOUT:-240} python3 scripts/gpu/host_profile.py ${HOSTPROF_CELLS:-mobilenet_v2:float32:channels_last:full \
    efficientnet_b0:float32:channels_last:full mobilenet_v2:bfloat16:channels_last efficientnet_b0:bfloat16:channels_last} \
    > "$R/hostprof.txt" 2>&1; echo "== hostprof rc=$?"; grep -v Warning "$R/hostprof.txt" | tail -120
fi
if has firstprof; then  # the cold and the warm first step of FIRSTPROF_MODEL, each side, under cProfile
  for side in torch auto; do
    rm -rf /tmp/firstprof; for run in cold warm; do
      PORTCONV_CACHE_DIR=/tmp/firstprof/pc CUDA_CACHE_PATH=/tmp/firstprof/cuda timeout 120 python3 \
        scripts/gpu/first_profile.py $side ${FIRSTPROF_MODEL:-mobilenet_v2 float32} > "$R/firstprof-$side-$run.txt" 2>&1
      echo "== firstprof $side $run rc=$?"; grep FIRST "$R/firstprof-$side-$run.txt"
      # the native executor's build (Note [native executor]) lands before the warm process, as after a real first run
      PORTCONV_CACHE_DIR=/tmp/firstprof/pc python3 -c 'from portconv import native; native.wait()'
    done
  done
fi
if has models; then
  timeout ${MODELS_TIMEOUT:-400} python3 -m portconv.bench --models ${MODELS_ARGS:-} --resume --out /tmp/models \
    > "$R/models.txt" 2>&1; echo "== models rc=$?"; tail -40 "$R/models.txt"
fi
if has first; then
  timeout ${FIRST_TIMEOUT:-300} python3 -m portconv.bench --models ${FIRST_ARGS:-} --first-step --resume --out /tmp/models \
    > "$R/first.txt" 2>&1; echo "== first rc=$?"; tail -20 "$R/first.txt"
fi
if has models || has first; then mkdir -p "$OUT/models" && cp -r /tmp/models/. "$OUT/models/"; fi
if has before; then bench bench-before "$PWD/.base" /tmp/cache-before; fi
if has bench; then bench bench "$PWD" /tmp/cache-after; fi
export PORTCONV_CACHE_DIR=/tmp/portconv-cache
pids=()
if has json; then  # JSON reports, one process per backend, in the background while tox runs
  for b in ${JSON_BACKENDS:-cuda cudnn hip opencl}; do
    dev=$([ $b = opencl ] && echo gpu || echo "")
    PORTCONV_OPENCL_DEVICE=$dev timeout 540 python3 -m portconv.cli conform --backend $b $DT -q \
      --json "$R/conformance-$b.json" > "$R/conform-$b.txt" 2>&1 & pids+=($!)
  done
fi
if has longred; then
  for b in cuda hip opencl; do
    dev=$([ $b = opencl ] && echo gpu || echo "")
    PORTCONV_OPENCL_DEVICE=$dev timeout 400 python3 -m portconv.cli conform --long-reductions --backend $b \
      > "$R/longred-$b.txt" 2>&1 & pids+=($!)
  done
fi
if has fuzz; then
  for b in cuda hip opencl; do
    dev=$([ $b = opencl ] && echo gpu || echo "")
    PORTCONV_OPENCL_DEVICE=$dev timeout 560 python3 -m portconv.cli conform --fuzz 1000000 --seed 7 --backend $b \
      $DT --seconds ${FUZZ_SECONDS:-300} > "$R/fuzz-$b.txt" 2>&1 & pids+=($!)
  done
fi
if has pocl; then  # the host's PoCL (the GPU machine's is Debian PoCL 5.0, LLVM 16; CI's is 3.1)
  PORTCONV_OPENCL_DEVICE=cpu timeout ${POCL_TIMEOUT:-540} python3 -m portconv.cli conform --backend opencl \
    --dtype float32,float64 -q --json "$R/conformance-pocl.json" > "$R/conform-pocl.txt" 2>&1 & pids+=($!)
fi
if has tox; then  # the three device envs side by side (16 cores, one GPU)
  for ew in ${TOX_ENVS:-cuda hip opencl}; do
    e=${ew%%:*}; n=$([[ $ew == *:* ]] && echo "${ew##*:}" || echo 3)
    timeout ${TOX_TIMEOUT:-560} python3 -m tox -e $e -- -n $n -p no:cacheprovider -W ignore > "$R/tox-$e.txt" 2>&1 & pids+=($!)
  done
fi
if has grid; then  # each own kernel set's conformance grid and GPU test file, pytest directly (no cudnn): on two
  # GPUs (nvidia-h200-x2, 32 cores) cuda on GPU 1, hip and opencl on GPU 0; H200s: 62 s, 53 s, 79 s
  G="--full-grid $(echo $DT | sed 's/,/ --dtype /g') -p no:cacheprovider -W ignore -q -rfEs tests/test_conformance.py"
  CUDA_VISIBLE_DEVICES=$(nvidia-smi -L | wc -l | awk '{print $1 - 1}') PORTCONV_POISON=1 timeout ${GRID_TIMEOUT:-520} python3 -m pytest \
    -n ${GRID_CUDA_N:-14} --backend cuda $G tests/test_cuda.py > "$R/pytest-cuda.txt" 2>&1 & pids+=($!)
  PORTCONV_POISON=1 timeout ${GRID_TIMEOUT:-520} python3 -m pytest -n 8 --backend hip $G tests/test_hip.py > "$R/pytest-hip.txt" 2>&1 &
  pids+=($!)
  PORTCONV_POISON=1 PORTCONV_OPENCL_DEVICE=gpu timeout ${GRID_TIMEOUT:-520} python3 -m pytest -n 8 --backend opencl $G tests/test_opencl.py \
    > "$R/pytest-opencl.txt" 2>&1 & pids+=($!)
fi
if has torch; then
  timeout ${TORCH_TIMEOUT:-560} python3 -m pytest -q -p no:cacheprovider -W ignore --backend cuda --backend cudnn --backend hip \
    tests/test_compile.py tests/test_autograd.py tests/test_nn.py > "$R/pytest-torch.txt" 2>&1 & pids+=($!)
fi
if has explain; then
  for b in auto cuda cudnn hip; do
    python3 -m portconv.cli explain --suite portconv/bench/suite.json $([ $b = auto ] || echo --backend $b) \
      > "$R/explain-$b.txt" 2>&1; echo "== explain $b rc=$?"
  done
fi
for p in "${pids[@]}"; do wait "$p"; echo "job rc=$?"; done
for f in "$R"/tox-*.txt "$R"/pytest-*.txt; do [ -f "$f" ] || continue; echo "== $f"; grep -E "^(FAILED|ERROR)" "$f" | cut -c1-220 | head -8
  tail -2 "$f"; done
for f in "$R"/longred-*.txt "$R"/fuzz-*.txt; do [ -f "$f" ] || continue; echo "== $f"; cut -c1-160 "$f" | tail -8; done
for f in "$R"/conform-*.txt; do [ -f "$f" ] || continue; echo "== $f"; tail -6 "$f"; done
tar -czf "$OUT/reports.tgz" -C "$R" .
