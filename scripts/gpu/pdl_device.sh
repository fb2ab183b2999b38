#!/bin/bash
# One device call for Note [dependent launch] (portconv/backends/_replay.py): the full conformance grid of the cuda
# backend in four dtypes and of hip (HIP-on-NVIDIA) in bfloat16 (the checked calls are replays, Note [checked call
# is the second]), the GPU replay tests, weight gradients with the finalize's dependent launch on and off in one
# process (scripts/gpu/depthwise_bench.py, variant pdl=0), and `portconv bench --hold-stream` of DW_ROW with
# PORTCONV_CUDA_PDL unset, 0, unset. Run from the repository root on the device machine with $OUT set.
# Knobs: CONF_S, DW_ROWS, DW_ROW.
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD PORTCONV_POISON=1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
t0=$(date +%s)
for dt in float32 float64 float16 bfloat16; do
    (timeout ${CONF_S:-150} python3 -m pytest -q -p no:cacheprovider -rf --tb=line --backend cuda --full-grid \
        --dtype $dt tests/test_conformance.py > $OUT/conf_$dt.txt 2>&1; echo "rc=$?" >> $OUT/conf_$dt.txt) &
done
(timeout ${CONF_S:-150} python3 -m pytest -q -p no:cacheprovider -rf --tb=line --backend hip --full-grid \
    --dtype bfloat16 tests/test_conformance.py > $OUT/conf_hip_bfloat16.txt 2>&1; echo "rc=$?" >> $OUT/conf_hip_bfloat16.txt) &
(timeout 200 python3 -m pytest -q -p no:cacheprovider -rf --tb=short --backend cuda tests/test_cuda.py \
    -k "replay or weight or finalize" > $OUT/gpu_tests.txt 2>&1; echo "rc=$?" >> $OUT/gpu_tests.txt) &
wait
for f in $OUT/conf_*.txt $OUT/gpu_tests.txt; do echo "== $(basename $f): $(grep -E '(passed|failed)' $f | tail -1) $(tail -1 $f)"; \
    grep "^FAILED" $f | head -5; done
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
