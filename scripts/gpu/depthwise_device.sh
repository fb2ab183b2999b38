#!/bin/bash
# One device call for the depthwise work (issue 5 target 1): conformance of the depthwise cases on the cuda and
# hip (HIP-on-NVIDIA) backends in four dtypes, in parallel, then scripts/gpu/depthwise_bench.py.
# Run from the repository root on the device machine with $OUT set. Knobs: CONF_S, BENCH_S, DW_* of the bench.
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD PORTCONV_POISON=1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
K=${CONF_K:-dw or g4}
conf() {  # backend, tile setting, dtype, output name
    PORTCONV_CUDA_DEPTHWISE_TILE=$2 timeout ${CONF_S:-120} python3 -m pytest -q -p no:cacheprovider -rf --tb=line \
        --backend $1 --full-grid --dtype $3 tests/test_conformance.py -k "$K" > $OUT/$4.txt 2>&1
    echo "$4 rc=$?" >> $OUT/$4.txt
}
t0=$(date +%s)
for dt in float32 float64 float16 bfloat16; do  # one process per (backend, dtype): 12 in parallel
    conf cuda auto $dt conf_cuda_$dt & conf hip auto $dt conf_hip_$dt & conf cuda all $dt conf_cuda_tileall_$dt &
done
wait
for f in $OUT/conf_*.txt; do echo "== $(basename $f): $(grep -E '(passed|failed)' $f | tail -1) $(tail -1 $f)"; \
    grep "^FAILED" $f | head -5; done
echo "conformance $(( $(date +%s) - t0 )) s"
for f in $OUT/conf_*.txt; do echo "=== $(basename $f)"; cat $f; done > $OUT/conformance.log && rm $OUT/conf_*.txt
DW_CONFORM=0 timeout ${BENCH_S:-150} python3 scripts/gpu/depthwise_bench.py $OUT 2>&1 | tail -40
echo "total $(( $(date +%s) - t0 )) s"
