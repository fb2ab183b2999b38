#!/bin/bash
# Device calls for the depthwise tile shapes (Note [depthwise tile], Note [packed rows];
# docs/performance/notes-depthwise-v3.md "v5"). Run from the repository root with $OUT set; everything lands in
# $OUT/dw-tiles.tgz, packed again after every step so a call cut short keeps what it has.
#   bash scripts/gpu/dw_tiles.sh sweep16   tile-shape and switch sweeps (scripts/gpu/depthwise_bench.py KNOBS) of
#                                          mbv2-dw3x3-bf16 and -bf16-cl
#   bash scripts/gpu/dw_tiles.sh sweep32   the same for the float32 2-D rows and dw3d-3x3x3, then ncu on the bf16
#                                          NCHW forward
#   bash scripts/gpu/dw_tiles.sh sweepw    the unit shape of the 16-bit channels-last weight gradient
#   bash scripts/gpu/dw_tiles.sh ring      Note [async row ring] on / off and its slot count (VR1: weight
#                                          gradient, VR2: forward / backward-data)
#   bash scripts/gpu/dw_tiles.sh conform   the depthwise conformance (scripts/gpu/depthwise_device.sh: cuda, cuda
#                                          with the tiles everywhere, HIP-on-NVIDIA x 4 dtypes), then every
#                                          depthwise row at the defaults (depthwise_bench.py)
#   bash scripts/gpu/dw_tiles.sh profile   Nsight Compute of mbv2-dw3x3-bf16-cl's three directions (portconv's kernels
#                                          and PyTorch's), then compute-sanitizer memcheck / racecheck on the 16-bit
#                                          depthwise conformance cases (the rings)
#   bash scripts/gpu/dw_tiles.sh bench     `portconv bench` on the depthwise rows, per call and --hold-stream
#                                          (BENCH_MODES: "call held" or one of them)
# Variant lists: V16A, V16B, V16C, V32, V3D, VW1, VW2, VR1, VR2 (';'-separated, as DW_VARIANTS with DW_SEP=';').
set -u
R=$OUT/dw-tiles; mkdir -p $R
pack() { tar czf $OUT/dw-tiles.tgz -C $OUT dw-tiles; }
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
python3 -c "import torch, cupy; print('torch', torch.__version__, 'cudnn', torch.backends.cudnn.version(), \
'cupy', cupy.__version__)" | tee $R/versions.txt
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee -a $R/versions.txt
sweep() {  # name, rows, variants, runs, seconds
    mkdir -p $R/$1
    DW_CONFORM=0 DW_RUNS=$4 DW_SEP=';' DW_ROWS=$2 DW_VARIANTS="$3" timeout $5 python3 scripts/gpu/depthwise_bench.py \
        $R/$1 > $R/$1/log.txt 2>&1
    cat $R/$1/depthwise.md 2>/dev/null || tail -5 $R/$1/log.txt; pack
}
case $1 in
sweep16)  # three variants a process: each variant compiles depthwise.cu anew (NVRTC), about 15 s in 16-bit types
    sweep bf16a mbv2-dw3x3-bf16 "${V16A:-v3;v3@la=1;v3@thn16=4,la=1}" 60 120
    sweep bf16b mbv2-dw3x3-bf16 "${V16B:-v3@thn16=16,la=1;v3@vwn16=8,la=1;v3@pf16=1}" 60 120
    sweep bf16cl mbv2-dw3x3-bf16-cl "${V16C:-v3;v3@la=1;v3@thc=8,la=1}" 60 120
    ;;
sweep32)
    sweep f32 mbv2-dw3x3,mbv2-dw3x3-s2 "${V32:-v3;v3@la=1;v3@pf=0,la=1;v3@thn=4,la=1}" 60 150
    sweep dw3d dw3d-3x3x3 "${V3D:-v3;v3@la=1;v3@th3=4,la=1}" 40 130
    for v in "v3@la=1" v3; do
        DW_VARIANT=$v timeout 40 ncu --clock-control none -k regex:tilen_s1 --section SpeedOfLight --section Occupancy \
            --section LaunchStats --section WarpStateStats python3 scripts/gpu/dw_ncu.py mbv2-dw3x3-bf16 \
            > "$R/ncu-bf16-${v//[@,=]/_}.txt" 2>&1
        grep -E "Duration|Registers Per|Achieved Occupancy|Compute \(SM\)" "$R/ncu-bf16-${v//[@,=]/_}.txt" | head -12
    done
    pack ;;
sweepw)  # the weight gradient's unit shape (its 2026-11-25 run also tried register caps, not kept: notes "v5")
    sweep wcl1 mbv2-dw3x3-bf16-cl "${VW1:-v3;v3@vww4=1;v3@thw4=4}" 60 120
    sweep wcl2 mbv2-dw3x3-bf16-cl "${VW2:-v3@thw4=16;v3@thw4=16,vww4=1}" 60 120
    ;;
ring)  # Note [async row ring]: the 16-bit channels-last weight gradient without / with 2-4 slots
    sweep ring1 mbv2-dw3x3-bf16-cl "${VR1:-v3@ring=0;v3;v3@rd=2;v3@rd=4}" 60 150
    sweep ring2 mbv2-dw3x3-bf16-cl "${VR2:-v3@fring=0;v3@frd=2;v3@frd=3;v3}" 60 150
    ;;
conform)
    OUT=$R CONF_S=${CONF_S:-150} BENCH_S=1 bash scripts/gpu/depthwise_device.sh > $R/conformance-summary.txt 2>&1
    tail -16 $R/conformance-summary.txt; pack
    unset PORTCONV_POISON
    mkdir -p $R/rows
    DW_CONFORM=0 DW_RUNS=60 DW_VARIANTS=v3 timeout 110 python3 scripts/gpu/depthwise_bench.py $R/rows > $R/rows/log.txt 2>&1
    tail -26 $R/rows/log.txt; pack ;;
profile)
    timeout ${NCU_S:-240} ncu --clock-control none --section SpeedOfLight --section MemoryWorkloadAnalysis \
        --section Occupancy --section LaunchStats --section WarpStateStats --section SchedulerStats \
        python3 scripts/gpu/dw_ncu.py mbv2-dw3x3-bf16-cl > $R/ncu-bf16-cl.txt 2>&1
    grep -E "^  [A-Za-z_].*\(|Duration|Registers Per|Achieved Occupancy|Compute \(SM\) Th|DRAM Throughput|L1/TEX Hit|L2 Hit|Issued Warp|Warp Cycles Per Issued" \
        $R/ncu-bf16-cl.txt | head -150; pack
    for tool in memcheck racecheck; do
        PORTCONV_POISON=1 timeout ${SAN_S:-150} compute-sanitizer --tool $tool --print-limit 20 python3 -m pytest -q \
            -p no:cacheprovider -rf --tb=line --backend cuda --full-grid --dtype ${SAN_DT:-bfloat16} \
            tests/test_conformance.py -k "${SAN_K:-dw or g4}" > $R/sanitizer-$tool.txt 2>&1
        echo "rc=$?" >> $R/sanitizer-$tool.txt; tail -6 $R/sanitizer-$tool.txt; pack
    done ;;
bench)
    ROWS='mbv2-dw3x3,mbv2-dw3x3-bf16,mbv2-dw3x3-bf16-cl,mbv2-dw3x3-s2,mbv2-dw3x3-last,mbv2-dw3x3-b1,dw3d-3x3x3'
    for m in ${BENCH_MODES:-call held}; do
        extra=""; [ $m = held ] && extra=--hold-stream
        timeout 270 python3 -m portconv.cli bench --rows "$ROWS" --backend cuda,auto --cell-seconds 2 \
            --no-torch-variants $extra --out $R/bench-$m > $R/bench-$m.log 2>&1
        tail -30 $R/bench-$m.log; pack
    done ;;
esac
