#!/bin/bash
# The second device call for Note [dependent launch] (after pdl_device.sh): depthwise conformance in float32 and
# bfloat16 (cuda, full grid 'dw or g4'), weight gradients with the dependent launch on and off in one process, and
# `portconv bench --hold-stream` of mbv2-dw3x3-bf16-cl with PORTCONV_CUDA_PDL unset, 0, unset.
# Run from the repository root on the device machine with $OUT set.
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD PORTCONV_POISON=1
t0=$(date +%s)
for dt in float32 bfloat16; do (timeout 100 python3 -m pytest -q -p no:cacheprovider -rf --tb=line --backend cuda --full-grid --dtype $dt tests/test_conformance.py -k "dw or g4" > $OUT/conf_$dt.txt 2>&1; echo "rc=$?" >> $OUT/conf_$dt.txt) & done; wait
for f in $OUT/conf_*.txt; do echo "== $(basename $f): $(grep -E '(passed|failed)' $f | tail -1) $(tail -1 $f)"; done
DW_CONFORM=0 DW_ROWS=mbv2-dw3x3-bf16-cl,mbv2-dw3x3 DW_DIRS=bwd_weight DW_RUNS=60 DW_SEP=";" DW_VARIANTS="v3;v3@pdl=0;v3" timeout 100 python3 scripts/gpu/depthwise_bench.py $OUT > $OUT/pdl.txt 2>&1; echo "pdl rc=$?"; tail -5 $OUT/pdl.txt; rm -f $OUT/depthwise.json
for run in on off on2; do mkdir -p $OUT/$run; ([ $run = off ] && export PORTCONV_CUDA_PDL=0; timeout 80 python3 -m portconv.cli bench --hold-stream --backend cuda --rows mbv2-dw3x3-bf16-cl --out $OUT/$run > $OUT/$run/bench.txt 2>&1); rm -f $OUT/$run/bench.png $OUT/$run/bench.json; [ $run = on ] || rm -f $OUT/$run/bench.md; echo "== $run"; grep -E "^  (torch|cuda) " $OUT/$run/bench.txt; done
echo "total $(( $(date +%s) - t0 )) s"
