#!/bin/bash
# Device calls of the sixth session of 2026-11-25 (docs/performance/h100-2026-11-25f, notes-depthwise-v3.md "v10").
# Run from the repository root on the device machine with $OUT set.
#   bash scripts/gpu/dw_device.sh sweep   conformance of the depthwise cases (cuda x CONF_DTYPES, HIP-on-NVIDIA x
#                                         HIP_DTYPES; PLANE=all: with the plane kernels of tried-planes.patch wherever
#                                         they apply), then depthwise_bench.py over ROWS x VARIANTS x DIRS
#   bash scripts/gpu/dw_device.sh final   the full conformance grid at the defaults (cuda x CONF_DTYPES, hip x
#                                         HIP_DTYPES), then `portconv bench --hold-stream --backend cuda,cudnn,auto`
#                                         over BENCH_ROWS (default: all)
#   bash scripts/gpu/dw_device.sh grid    the full conformance grid only
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD  # PORTCONV_POISON=1 only for the conformance (a fill kernel timed otherwise)
python3 -c "import torch, cupy; print('torch', torch.__version__, 'cudnn', torch.backends.cudnn.version(), \
'cupy', cupy.__version__)" | tee $OUT/versions.txt
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee -a $OUT/versions.txt
t0=$(date +%s)
conf() {  # backend, dtype, -k filter or "", seconds
    (PORTCONV_POISON=1 timeout $4 python3 -m pytest -q -p no:cacheprovider -rf --tb=line --backend $1 --full-grid \
        --dtype $2 tests/test_conformance.py ${3:+-k "$3"} > $OUT/conf_$1_$2.txt 2>&1
     echo "rc=$?" >> $OUT/conf_$1_$2.txt) &
}
summary() {
    for f in $OUT/conf_*.txt; do [ -e $f ] || continue
        echo "== $(basename $f): $(grep -E '(passed|failed)' $f | tail -1) $(tail -1 $f)"; grep "^FAILED" $f | head -5
    done
    for f in $OUT/conf_*.txt; do echo "=== $(basename $f)"; cat $f; done > $OUT/conformance.log && rm -f $OUT/conf_*.txt
    echo "conformance $(( $(date +%s) - t0 )) s"
}
case $1 in
sweep)
    [ -n "${PLANE:-}" ] && export PORTCONV_CUDA_DEPTHWISE_PLANE=$PLANE
    for dt in ${CONF_DTYPES-float32 float64 float16 bfloat16}; do conf cuda $dt "dw or g4" ${CONF_S:-150}; done
    for dt in ${HIP_DTYPES-float32 bfloat16}; do conf hip $dt "dw or g4" ${CONF_S:-150}; done
    wait; summary
    unset PORTCONV_CUDA_DEPTHWISE_PLANE
    DW_CONFORM=0 DW_RUNS=${RUNS:-40} DW_SEP=';' DW_DIRS=${DIRS:-fwd,bwd_data} \
        DW_ROWS=${ROWS:-mbv2-dw3x3,mbv2-dw3x3-bf16,mbv2-dw3x3-s2,mbv2-dw3x3-last,mbv2-dw3x3-b1} \
        DW_VARIANTS="${VARIANTS:-v3}" timeout ${BENCH_S:-300} \
        python3 scripts/gpu/depthwise_bench.py $OUT > $OUT/sweep.txt 2>&1
    echo "sweep rc=$?"; grep -A40 "^| row" $OUT/depthwise.md | head -40; grep "^registers" $OUT/sweep.txt | head -20;;
grid|final)  # the full conformance grid (cuda x CONF_DTYPES, hip x HIP_DTYPES); final: then the bench
    for dt in ${CONF_DTYPES-float32 float64 float16 bfloat16}; do conf cuda $dt "" ${CONF_S:-200}; done
    for dt in ${HIP_DTYPES-float32 bfloat16}; do conf hip $dt "" ${CONF_S:-200}; done
    wait; summary
    if [ $1 = final ]; then
        timeout ${BENCH_S:-330} python3 -m portconv.cli bench --hold-stream --backend cuda,cudnn,auto \
            ${BENCH_ROWS:+--rows $BENCH_ROWS} --out $OUT/bench > $OUT/bench.txt 2>&1
        echo "bench rc=$?"; gzip -f $OUT/bench/bench.json; sed -n '/^## Geomean/,/^## Method/p' $OUT/bench/bench.md
    fi;;
esac
echo "total $(( $(date +%s) - t0 )) s"
