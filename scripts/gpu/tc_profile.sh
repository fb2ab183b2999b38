#!/usr/bin/env bash
# Issue 5 target 3/4 diagnostics, one device call: OpenCL inline-PTX probe; Nsight Compute on the big igemm-tc rows and on cuDNN's kernels for them
set -uo pipefail
OUT=${OUT:-out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PORTCONV_CACHE_DIR=/tmp/portconv-cache PYTHONPATH="$PWD"
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --find-links .whl --target /tmp/pyo \
  pyopencl pytools platformdirs siphash24 typing_extensions >/dev/null 2>&1
mkdir -p /tmp/icd && echo libnvidia-opencl.so.1 > /tmp/icd/nvidia.icd
( export PYTHONPATH="$PWD:/tmp/pyo" OCL_ICD_VENDORS=/tmp/icd; timeout 60 python3 scripts/gpu/ocl_ptx_probe.py ) 2>&1 | tee "$OUT/ptx-probe.txt"
S="--section SpeedOfLight --section WarpStateStats --section Occupancy --section LaunchStats --section MemoryWorkloadAnalysis --section SchedulerStats --section InstructionStats --metrics smsp__average_warps_issue_stalled_long_scoreboard_per_issue_active.ratio,smsp__average_warps_issue_stalled_barrier_per_issue_active.ratio,smsp__average_warps_issue_stalled_mio_throttle_per_issue_active.ratio,smsp__average_warps_issue_stalled_short_scoreboard_per_issue_active.ratio,smsp__average_warps_issue_stalled_math_pipe_throttle_per_issue_active.ratio,smsp__average_warps_issue_stalled_wait_per_issue_active.ratio,smsp__average_warps_issue_stalled_not_selected_per_issue_active.ratio,smsp__average_warps_issue_stalled_lg_throttle_per_issue_active.ratio,smsp__average_warps_issue_stalled_dispatch_stall_per_issue_active.ratio,smsp__average_warps_issue_stalled_selected_per_issue_active.ratio,smsp__average_warps_issue_stalled_no_instruction_per_issue_active.ratio,smsp__average_warps_issue_stalled_tex_throttle_per_issue_active.ratio,smsp__average_warps_issue_stalled_drain_per_issue_active.ratio,smsp__average_warps_issue_stalled_membar_per_issue_active.ratio"
for spec in "deeplabv3-aspp-d12 float16 fwd" "r3d18-l1-3d float16 fwd" "resnet50-l1-3x3-bf16-cl bfloat16 fwd" "resnet50-l1-3x3 float16 fwd" "vae-dec-transposed-bf16 float16 fwd" "wav2vec2-conv1d float16 fwd"; do
  set -- $spec
  echo "=== ncu $spec"
  timeout 120 ncu --clock-control none -k regex:portconv_igemm --launch-skip 1 -c 1 $S python3 scripts/gpu/tc_ncu.py $1 $2 $3 > "$OUT/ncu-$1-$2.txt" 2>&1
  grep -E "portconv_igemm|Duration|Registers Per|Shared Memory Config|Achieved Occupancy|Theoretical Occupancy|Issue Slots Busy|No Eligible|Warp Cycles Per Issued|Compute \(SM\) Throughput|Memory Throughput|L1/TEX Hit|L2 Hit|Executed Ipc A|Block Size|Grid Size|Stall|stalled|One or More" "$OUT/ncu-$1-$2.txt" | head -60
done
for spec in "deeplabv3-aspp-d12 float16" "resnet50-l1-3x3-bf16-cl bfloat16" "r3d18-l1-3d float16"; do
  set -- $spec
  echo "=== ncu cudnn $spec"
  timeout 120 ncu --clock-control none --launch-skip 2 -c 3 --section SpeedOfLight --section LaunchStats --section Occupancy python3 scripts/gpu/tc_ncu.py $1 $2 fwd torch > "$OUT/ncu-cudnn-$1.txt" 2>&1
  grep -E "^  [a-zA-Z_].*\(|Duration|Registers Per|Block Size|Grid Size|Compute \(SM\) Throughput|Achieved Occupancy|Dynamic Shared|Error|error" "$OUT/ncu-cudnn-$1.txt" | head -30
done
