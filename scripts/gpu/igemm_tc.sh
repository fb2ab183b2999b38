#!/usr/bin/env bash
# Tensor-core implicit GEMM on the device, one call: its GPU tests and the conformance grid (cuda backend; float16,
# bfloat16, float32 on TF32) side by side, then the tile sweep against cuDNN and/or the suite bench.
# Usage (repo root, on the device):  OUT=... bash scripts/gpu/igemm_tc.sh [tests] [conform] [racecheck] [sweep] [bench]
#   [bench-float16 ...]. CONFORM_DTYPES (default "float16 bfloat16 float32"); SWEEP_DIRS=bwd-weight (say) times one
#   direction; SWEEP_LOG=0 keeps only the sweeps' JSON (the device tool returns at most 8 files). The v5 evidence
#   (docs/performance/h100-igemm-tc/v5) came from CONFORM_DTYPES="float16 bfloat16 float32 float64" ... tests
#   conform racecheck, then
#   SWEEP_LOG=0 SWEEPS="float16:v4,auto bfloat16:v4,auto float32:v4,auto" SWEEP_BUDGET=150 ... sweep.
set -uo pipefail
OUT=${OUT:-out}; mkdir -p "$OUT"
steps=${*:-tests conform sweep}
has() { [[ " $steps " == *" $1 "* ]]; }
export PYTHONUNBUFFERED=1 PORTCONV_CACHE_DIR=/tmp/portconv-cache PYTHONPATH="$PWD"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/device.txt"
T0=$(date +%s)
pids=()
if has tests; then
  PORTCONV_POISON=1 timeout ${TESTS_S:-170} python3 -m pytest -q -rfE -p no:cacheprovider --backend cuda \
    tests/test_cuda.py ${TESTS_K:+-k "$TESTS_K"} > "$OUT/pytest-cuda.txt" 2>&1 & pids+=($!)
fi
if has conform; then
  PORTCONV_POISON=1 timeout ${TESTS_S:-170} python3 -m pytest -q -rfE -p no:cacheprovider --backend cuda --full-grid \
    $(for d in ${CONFORM_DTYPES:-float16 bfloat16 float32}; do echo --dtype $d; done) tests/test_conformance.py \
    > "$OUT/conform.txt" 2>&1 & pids+=($!)
fi
for p in "${pids[@]}"; do wait "$p"; done
echo "correctness: $(( $(date +%s) - T0 )) s"
for f in pytest-cuda conform; do [ -f "$OUT/$f.txt" ] && { echo "== $f"; tail -n 25 "$OUT/$f.txt"; }; done
if has racecheck; then  # the vector-gather and staging paths (Note [vector gathers], Note [channels-last staging])
  timeout 100 compute-sanitizer --tool racecheck --print-limit 5 python3 -m pytest -q -p no:cacheprovider \
    --backend cuda tests/test_cuda.py -k "${RACE_K:-(vector_gathers or staging) and (dtype0 or dtype1)}" \
    > "$OUT/racecheck.txt" 2>&1
  echo "== racecheck"; tail -n 2 "$OUT/racecheck.txt"
fi
if has sweep; then  # SWEEPS: dtype:tiles items (tiles: auto and/or cuda.TC_TILES names)
  for item in ${SWEEPS:-float16:auto,128x128,128x64,64x128 float32:auto,128x128,128x64,64x128}; do
    dt=${item%%:*}; tiles=${item#*:}
    timeout ${SWEEP_S:-150} python3 scripts/gpu/igemm_tc.py --budget ${SWEEP_BUDGET:-100} --dtypes $dt \
      --tiles $tiles ${SWEEP_ROWS:+--rows $SWEEP_ROWS} ${SWEEP_DIRS:+--dirs $SWEEP_DIRS} --out "$OUT/sweep-$dt.json" \
      > "/tmp/sweep-$dt.txt" 2>&1
    [ "${SWEEP_LOG:-1}" = 0 ] || cp "/tmp/sweep-$dt.txt" "$OUT/"
    echo "== sweep $dt ($(( $(date +%s) - T0 )) s)"; cut -c1-420 "/tmp/sweep-$dt.txt"
  done
fi
ROWS='resnet50-*,deepbench-*,mbv2-pw-project,resnext50-g32,deeplabv3-aspp-d12,wav2vec2-*,r3d18-l1-3d,vae-dec-transposed-bf16,dcgan-gen-transposed'
if has bench; then
  timeout ${BENCH_S:-200} python3 -m portconv.bench --rows "$ROWS" --backend cuda,cudnn --cell-seconds 1 --runs 20 \
    --warmup 3 --no-torch-variants --no-peaks --out "$OUT/bench" > "$OUT/bench.txt" 2>&1
  echo "== bench ($(( $(date +%s) - T0 )) s)"; tail -n 60 "$OUT/bench.txt" | cut -c1-300
fi
for dt in float16 bfloat16; do
  if has bench-$dt; then
    timeout ${BENCH_S:-150} python3 -m portconv.bench --rows "$ROWS" --dtype $dt --backend cuda,cudnn --cell-seconds 1 \
      --runs 20 --warmup 3 --no-torch-variants --no-peaks --out "$OUT/bench-$dt" > "$OUT/bench-$dt.txt" 2>&1
    echo "== bench $dt ($(( $(date +%s) - T0 )) s)"; tail -n 40 "$OUT/bench-$dt.txt" | cut -c1-300
  fi
done
echo "total: $(( $(date +%s) - T0 )) s"
