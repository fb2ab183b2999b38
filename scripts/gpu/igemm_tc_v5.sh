#!/usr/bin/env bash
# igemm-tc v5 evidence in one device call (< 9 min): GPU tests of the tensor-core tile, the cuda conformance full
# grid in four dtypes, racecheck on the vector / staging paths, and the 14 dense rows swept in float16, bfloat16 and
# float32 (TF32) with the v4 kernel beside v5 in the same process. At most 8 files in $OUT (the device tool's limit).
# Two calls fit the 10-minute limit:  bash scripts/gpu/igemm_tc_v5.sh check  /  bash scripts/gpu/igemm_tc_v5.sh sweep
set -uo pipefail
steps=" ${*:-check sweep} "
OUT=${OUT:-out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PORTCONV_CACHE_DIR=/tmp/portconv-cache PYTHONPATH="$PWD"
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  python3 -c "import torch, cupy; print('torch', torch.__version__, 'cudnn', torch.backends.cudnn.version(), 'cupy', \
cupy.__version__, 'nvrtc', cupy.cuda.nvrtc.getVersion())"; } > "$OUT/device.txt" 2>&1; cat "$OUT/device.txt"
if [[ "$steps" == *" check "* ]]; then
PORTCONV_POISON=1 timeout 220 python3 -m pytest -q -rfE -p no:cacheprovider --backend cuda tests/test_cuda.py \
  > "$OUT/pytest-cuda.txt" 2>&1 &
p1=$!
PORTCONV_POISON=1 timeout 220 python3 -m pytest -q -rfE -p no:cacheprovider --backend cuda --full-grid \
  --dtype float16 --dtype bfloat16 --dtype float32 tests/test_conformance.py > "$OUT/conform.txt" 2>&1 &
p2=$!
PORTCONV_POISON=1 timeout 220 python3 -m pytest -q -rfE -p no:cacheprovider --backend cuda --full-grid \
  --dtype float64 tests/test_conformance.py > "$OUT/conform-f64.txt" 2>&1 &
p3=$!
wait $p1 $p2 $p3
for f in pytest-cuda conform conform-f64; do echo "== $f"; grep -E "^(FAILED|ERROR)|passed|failed" "$OUT/$f.txt" | tail -5; done
timeout 90 compute-sanitizer --tool racecheck --print-limit 5 python3 -m pytest -q -p no:cacheprovider --backend cuda \
  tests/test_cuda.py -k "(vector_gathers or staging) and (dtype0 or dtype1)" > "$OUT/racecheck.txt" 2>&1
tail -2 "$OUT/racecheck.txt"
fi
[[ "$steps" == *" sweep "* ]] || exit 0
for dt in float16 bfloat16 float32; do
  timeout 190 python3 scripts/gpu/igemm_tc.py --budget ${SWEEP_BUDGET:-150} --dtypes $dt --tiles v4,auto --out "$OUT/sweep-$dt.json" \
    2>&1 | cut -c1-330
done
