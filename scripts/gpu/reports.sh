#!/usr/bin/env bash
# One device-machine call that produces the committed GPU evidence: tox -e cuda / hip / opencl (whole grid, four
# dtypes), the JSON conformance reports of every GPU backend, compute-sanitizer on a subset, and `portconv explain`
# for every suite row. Everything lands in $OUT/reports.tgz plus a summary; carry .whl (pyopencl + tox wheels).
# Usage (repo root, on the device):  bash scripts/gpu/reports.sh [tox] [json] [sanitize] [explain] [plan] [bench]
# TOX_ENVS (default "cuda hip opencl") and JSON_BACKENDS (default "cuda cudnn hip" plus opencl on the NVIDIA GPU;
# name opencl in it to keep it when setting it) pick the envs and backends.
set -uo pipefail
OUT=${OUT:-out}; R=/tmp/reports; mkdir -p "$OUT" "$R"
steps=${*:-tox json sanitize explain}
has() { [[ " $steps " == *" $1 "* ]]; }
export PYTHONUNBUFFERED=1 PORTCONV_CACHE_DIR=/tmp/portconv-cache OMP_NUM_THREADS=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  || exit 1
SITE=$(python3 -c 'import site; print(site.getsitepackages()[0])')
export PORTCONV_SITE_PACKAGES="/tmp/site:$SITE" PYTHONPATH="$PWD:/tmp/site"
mkdir -p /tmp/icd && echo libnvidia-opencl.so.1 > /tmp/icd/nvidia.icd
cp /etc/OpenCL/vendors/pocl.icd /tmp/icd/ 2>/dev/null; export OCL_ICD_VENDORS=/tmp/icd
{
  date -u; nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv
  python3 -c "import torch, cupy, pyopencl as cl; print('torch', torch.__version__, 'cuda', torch.version.cuda, \
'cudnn', torch.backends.cudnn.version(), 'cupy', cupy.__version__, 'nvrtc', cupy.cuda.nvrtc.getVersion(), \
'pyopencl', cl.VERSION_TEXT); print([(p.name, p.version, [d.name for d in p.get_devices()]) \
for p in cl.get_platforms()])"
  nvcc --version | tail -2
  python3 -m portconv.cli devices
} > "$R/env.txt" 2>&1
cat "$R/env.txt" | head -12
DT="--dtype float32,float64,float16,bfloat16"
pids=()
if has json; then  # JSON reports, one process per backend, in the background while tox runs
  for b in ${JSON_BACKENDS:-cuda cudnn hip}; do
    [ $b = opencl ] && continue  # below, on the NVIDIA GPU
    timeout 540 python3 -m portconv.cli conform --backend $b $DT -q --json "$R/conformance-$b.json" \
      > "$R/conform-$b.txt" 2>&1 & pids+=($!)
  done
  if [[ " ${JSON_BACKENDS:-opencl} " == *" opencl "* ]]; then
    PORTCONV_OPENCL_DEVICE=gpu timeout 540 python3 -m portconv.cli conform --backend opencl $DT -q \
      --json "$R/conformance-opencl-nvidia.json" > "$R/conform-opencl-nvidia.txt" 2>&1 & pids+=($!)
  fi
fi
if has tox; then  # the three device envs side by side (16 cores, one GPU)
  for e in ${TOX_ENVS:-cuda hip opencl}; do
    timeout 540 python3 -m tox -e $e -- -n 3 -p no:cacheprovider -W ignore > "$R/tox-$e.txt" 2>&1 & pids+=($!)
  done
fi
if has sanitize; then
  ( for tool in memcheck racecheck; do
      timeout 200 compute-sanitizer --tool $tool --print-limit 20 python3 scripts/gpu/sweep.py --no-time --no-cudnn \
        --cases dense3x3,grouped,dw3x3,dw3x3-cl,dw3x3-s2-cl,conv1d-same,tconv-op --dtypes float32,float16 > "$R/sanitize-$tool.txt" 2>&1
      echo "rc=$?" >> "$R/sanitize-$tool.txt"
    done ) & pids+=($!)
fi
if has explain; then
  for b in auto cuda cudnn hip; do
    python3 -m portconv.cli explain --suite portconv/bench/suite.json $([ $b = auto ] || echo --backend $b) \
      > "$R/explain-$b.txt" 2>&1; echo "== explain $b rc=$?"
  done
fi
for p in "${pids[@]}"; do wait "$p"; echo "conform job rc=$?"; done
if has plan; then  # the default-plan policy, tuning and fast path against a real GPU
  timeout 120 python3 -m pytest -q -p no:cacheprovider --backend cudnn --backend cuda tests/test_plan.py \
    tests/test_tune.py > "$R/pytest-plan-tune.txt" 2>&1; echo "== plan/tune tests rc=$?"; tail -2 "$R/pytest-plan-tune.txt"
fi
if has bench; then  # every suite row, every backend and PyTorch's variants; bench.json is rewritten after each row
  PORTCONV_OPENCL_DEVICE=gpu timeout ${BENCH_TIMEOUT:-380} python3 -m portconv.bench --cell-seconds ${BENCH_CELL_S:-2} \
    --overhead --backend all,auto+tune ${BENCH_ARGS:-} --out "$OUT/bench" > "$R/bench.txt" 2>&1
  echo "== bench rc=$?"; tail -40 "$R/bench.txt"
fi
for f in "$R"/tox-*.txt; do echo "== $f"; grep -E "^(FAILED|ERROR)" "$f" | cut -c1-220 | head -8; tail -2 "$f"; done
for f in "$R"/sanitize-*.txt; do echo "== $f"; grep -E "ERROR SUMMARY|RACECHECK SUMMARY|^rc=" "$f" | sort | uniq -c; done
for f in "$R"/conform-*.txt; do echo "== $f"; tail -14 "$f"; done
tar -czf "$OUT/reports.tgz" -C "$R" .
