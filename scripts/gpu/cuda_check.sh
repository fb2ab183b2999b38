#!/usr/bin/env bash
# One device-machine call for issue 3: environment, the cuda/cudnn sweep (all algorithms, 4 dtypes), the vendor
# tests, the conformance CI subset, and compute-sanitizer memcheck/racecheck on a small subset. Logs go to $OUT.
# Usage (repo root):  bash scripts/gpu/cuda_check.sh [sweep|tests|conform|sanitize|all]...
set -uo pipefail
export PYTHONPATH=. PYTHONUNBUFFERED=1 PORTCONV_CACHE_DIR=/tmp/portconv-cache
OUT=${OUT:-out}; mkdir -p "$OUT"
steps=${*:-all}
has() { [[ " $steps " == *" $1 "* || " $steps " == *" all "* ]]; }
{
  nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv
  python3 -c "import torch, cupy; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'cudnn', \
torch.backends.cudnn.version(), 'cupy', cupy.__version__, 'nvrtc', cupy.cuda.nvrtc.getVersion(), \
'gpus', torch.cuda.device_count())"
} 2>&1 | tee "$OUT/env.txt"
rc=0
if has sweep; then
  echo "== sweep"; timeout 200 python3 scripts/gpu/sweep.py 2>&1 | tee "$OUT/sweep.txt" || rc=1
fi
if has tests; then
  echo "== vendor tests"
  timeout 150 python3 -m pytest -q -rfEsP -p no:cacheprovider --backend cuda --backend cudnn tests/test_cuda.py \
    tests/test_cudnn.py > "$OUT/pytest.txt" 2>&1 || rc=1
  grep -E "^(FAILED|ERROR|SKIPPED)|passed|failed" "$OUT/pytest.txt" | tail -20
  grep -A14 "kernels:" "$OUT/pytest.txt" | grep -v "^--$" | cut -c1-150 | head -60
fi
if has conform; then
  echo "== conformance CI subset, 4 dtypes (failing ids stream as they happen)"
  OMP_NUM_THREADS=1 timeout 280 python3 -m pytest -v -n 16 -rfs --tb=short -p no:cacheprovider -W ignore \
    --backend cuda --backend cudnn --dtype float32 --dtype float64 --dtype float16 --dtype bfloat16 \
    tests/test_conformance.py 2>&1 | tee "$OUT/conform.txt" | grep --line-buffered -E " (FAILED|ERROR) " | cut -c1-160
  grep -E "^(FAILED|ERROR)" "$OUT/conform.txt" | cut -c1-300 | head -30
  grep -E "^SKIPPED" "$OUT/conform.txt" | sed -E 's/.*unsupported on ([a-z]+): /\1: /' | cut -c1-110 | sort \
    | uniq -c | sort -rn | head -12
  tail -1 "$OUT/conform.txt"
fi
if has sanitize; then
  for tool in memcheck racecheck; do
    echo "== compute-sanitizer $tool"
    timeout 100 compute-sanitizer --tool $tool --print-limit 20 python3 scripts/gpu/sweep.py --no-time --no-cudnn \
      --cases dense3x3,grouped,dw3x3,conv1d-same,tconv-op --dtypes float32,float16 > "$OUT/sanitize-$tool.txt" 2>&1
    echo "rc=$?"; grep -E "ERROR SUMMARY|RACECHECK SUMMARY|Hazard|Invalid|runs in" "$OUT/sanitize-$tool.txt" \
      | sort | uniq -c | head -10
  done
fi
exit $rc
