#!/bin/bash
# Call 1 of docs/performance/h100-2026-11-26b, kept here as the record of what ran, with tried-pretaps.patch applied
# to the working tree (its PC_DWP_PRETAPS=1 is the variant "v4"; "v4@pretaps=0" was the committed kernels' order,
# through a depthwise_bench.py knob removed with the patch). What the timing method costs and how far a copy gets on
# the small depthwise rows (scripts/gpu/copy_floor.py), the planes kernels in every dtype against v3
# (scripts/gpu/depthwise_bench.py with DW_DTYPES), and Nsight Compute of -last's forward. Run from the repository
# root on the device machine with $OUT set.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
python3 -c "import torch, cupy; print('torch', torch.__version__, 'cudnn', torch.backends.cudnn.version(), \
'cupy', cupy.__version__)" | tee $OUT/versions.txt
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee -a $OUT/versions.txt
t0=$(date +%s)
timeout ${FLOOR_S:-200} python3 scripts/gpu/copy_floor.py ${FLOOR_ROWS:-mbv2-dw3x3,mbv2-dw3x3-last,mbv2-dw3x3-b1} \
    > $OUT/copy_floor.md 2>&1; echo "copy_floor rc=$? $(( $(date +%s) - t0 )) s"; cat $OUT/copy_floor.md
DW_CONFORM=0 DW_RUNS=${RUNS:-40} DW_SEP=';' DW_DIRS=fwd,bwd_data DW_ROWS=mbv2-dw3x3-last,mbv2-dw3x3-14 \
    DW_DTYPES=${DTYPES:-float16,bfloat16,float64} DW_VARIANTS="v3;v4;v4@pretaps=0" timeout ${BENCH_S:-300} \
    python3 scripts/gpu/depthwise_bench.py $OUT > $OUT/sweep.txt 2>&1
echo "bench rc=$? $(( $(date +%s) - t0 )) s"; cat $OUT/depthwise.md; grep "^registers" $OUT/sweep.txt | head -30
DW_VARIANT=v4 DW_DIRS=fwd timeout ${NCU_S:-80} ncu --clock-control none --section SpeedOfLight --section Occupancy \
    --section LaunchStats --section WarpStateStats --section MemoryWorkloadAnalysis -k regex:planes \
    python3 scripts/gpu/dw_ncu.py mbv2-dw3x3-last > $OUT/ncu_last.txt 2>&1
echo "ncu rc=$? $(( $(date +%s) - t0 )) s"; grep -E "Duration|Throughput|Registers|Achieved Occ|Waves|Stall|Warp Cycles" \
    $OUT/ncu_last.txt | head -40
