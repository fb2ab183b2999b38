#!/bin/bash
# One device call for Note [dependent launch] (portconv/backends/_replay.py): the conformance grid (the checked calls
# are replays, Note [checked call is the second]) of the cuda backend in CONF_DTYPES and of hip (HIP-on-NVIDIA) in
# HIP_DTYPES, the GPU replay tests (GPU_TESTS=1), weight gradients with the finalize's dependent launch on and off in
# one process (scripts/gpu/depthwise_bench.py, variant pdl=0), and `portconv bench --hold-stream` of DW_ROW with
# PORTCONV_CUDA_PDL unset, 0, unset. Run from the repository root on the device machine with $OUT set.
# Knobs: CONF_S, CONF_K (a -k filter of the grid), CONF_DTYPES, HIP_DTYPES, GPU_TESTS, DW_ROWS, DW_ROW.
#   h100-2026-11-25e call 3: the defaults.
#   call 4: CONF_K="dw or g4" CONF_DTYPES="float32 bfloat16" HIP_DTYPES= GPU_TESTS=0 DW_ROWS=mbv2-dw3x3-bf16-cl,mbv2-dw3x3
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD PORTCONV_POISON=1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
t0=$(date +%s)
conf() {  # backend, dtype: the full grid, CONF_K-filtered
    (timeout ${CONF_S:-150} python3 -m pytest -q -p no:cacheprovider -rf --tb=line --backend $1 --full-grid \
        --dtype $2 tests/test_conformance.py ${CONF_K:+-k "$CONF_K"} > $OUT/conf_$1_$2.txt 2>&1
     echo "rc=$?" >> $OUT/conf_$1_$2.txt) &
}
for dt in ${CONF_DTYPES-float32 float64 float16 bfloat16}; do conf cuda $dt; done
for dt in ${HIP_DTYPES-bfloat16}; do conf hip $dt; done
if [ "${GPU_TESTS:-1}" = 1 ]; then
    (timeout 200 python3 -m pytest -q -p no:cacheprovider -rf --tb=short --backend cuda tests/test_cuda.py \
        -k "replay or weight or finalize" > $OUT/gpu_tests.txt 2>&1; echo "rc=$?" >> $OUT/gpu_tests.txt) &
fi
wait
for f in $OUT/conf_*.txt $OUT/gpu_tests.txt; do [ -e $f ] || continue
    echo "== $(basename $f): $(grep -E '(passed|failed)' $f | tail -1) $(tail -1 $f)"; grep "^FAILED" $f | head -5; done
echo "tests $(( $(date +%s) - t0 )) s"
for f in $OUT/conf_*.txt; do echo "=== $(basename $f)"; cat $f; done > $OUT/conformance.log && rm $OUT/conf_*.txt
DW_CONFORM=0 DW_ROWS=${DW_ROWS:-mbv2-dw3x3-bf16-cl,mbv2-dw3x3,deepbench-b1-3x3} DW_DIRS=bwd_weight DW_RUNS=60 \
    DW_SEP=";" DW_VARIANTS="v3;v3@pdl=0;v3" timeout 150 python3 scripts/gpu/depthwise_bench.py $OUT > $OUT/pdl.txt 2>&1
echo "pdl rc=$?"; tail -8 $OUT/pdl.txt; rm -f $OUT/depthwise.json
R=${DW_ROW:-mbv2-dw3x3-bf16-cl}
for run in on off on2; do
    mkdir -p $OUT/$run
    ([ $run = off ] && export PORTCONV_CUDA_PDL=0; timeout 90 python3 -m portconv.cli bench --hold-stream --backend cuda \
        --rows $R --out $OUT/$run > $OUT/$run/bench.txt 2>&1; echo "bench rc=$?" >> $OUT/$run/bench.txt)
    rm -f $OUT/$run/bench.png $OUT/$run/bench.json; [ $run = on ] || rm -f $OUT/$run/bench.md  # 8 files come back
    echo "== $run"; grep -E "^  (torch|cuda) " $OUT/$run/bench.txt
done
echo "total $(( $(date +%s) - t0 )) s"
