#!/usr/bin/env bash
# compute-sanitizer memcheck, racecheck and initcheck over the conformance grid of the cuda and hip (HIP-on-NVIDIA)
# kernel sets, on the GPU machine: repo root, python3 with torch (CUDA) and CuPy, compute-sanitizer on PATH or in
# /usr/local/cuda/bin.   bash scripts/gpu/sanitize.sh
# Which cases each tool runs: Note [sanitized grid] (scripts/gpu/sanitize.py). memcheck: the whole grid in float32, in
# SHARDS_MEMCHECK processes per kernel set; racecheck and initcheck: a case per distinct plan in float32, float64 and
# float16, SHARDS_SUBSET processes each. memcheck and racecheck check portconv's kernels only (--kernel-name
# kns=portconv_); initcheck checks every kernel, since a write it does not watch would leave memory it calls
# uninitialised, and the summary counts the reports in portconv's kernels apart. memcheck and initcheck run with torch's
# caching allocator off, so every tensor is an allocation of its own and a read past its end or of memory never written
# is not hidden inside a cached block. Each sanitizer process stops after SANITIZE_SECONDS (default 280): with the
# native step (at most SELECT_SECONDS, 240) the script ends within 9 minutes; what a stopped process ran is reported.
# Knobs: BACKENDS ("cuda hip"), MEMCHECK_DTYPES, SUBSET_DTYPES, SHARDS_MEMCHECK (4), SHARDS_SUBSET (2),
# SANITIZE_SECONDS. Results in $OUT: sanitize.tar.gz (every log, each case's result, the case lists) and summary.md;
# the summary table is printed last. Exit status: 0 when every run finished clean and every case passed.
set -uo pipefail
OUT=${OUT:-out}; R=/tmp/sanitize; rm -rf "$R"; mkdir -p "$OUT" "$R"
OUT=$(realpath "$OUT")
CS=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
if [ ! -x "$CS" ]; then
  echo "sanitize.sh: compute-sanitizer is neither on PATH nor in /usr/local/cuda/bin (the CUDA toolkit has it)" >&2
  exit 2
fi
BACKENDS=${BACKENDS:-cuda hip}; SHARDS_MEMCHECK=${SHARDS_MEMCHECK:-4}; SHARDS_SUBSET=${SHARDS_SUBSET:-2}
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 OMP_NUM_THREADS=1
export PORTCONV_CACHE_DIR=/tmp/sanitize-cache  # shared by every process: the native step compiles most kernels once
DRIVER="$PWD/scripts/gpu/sanitize.py"
{
  date -u; git log -1 --format='%H %s' 2>/dev/null
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  "$CS" --version | tail -1
  python3 -c "import torch, cupy; print('torch', torch.__version__, torch.version.cuda, 'cupy', cupy.__version__)"
} > "$R/env.txt" 2>&1
cat "$R/env.txt"
start=$SECONDS

echo "== the case lists (natively, both kernel sets at once; the representative cases run once, filling the cache)"
pids=()
# a cold cache compiles every plan's modules here (NVRTC, hundreds of them): SELECT_SECONDS bounds it
for b in $BACKENDS; do
  timeout "${SELECT_SECONDS:-240}" python3 "$DRIVER" select "$b" "$R" > "$R/select-$b.txt" 2>&1 & pids+=($!)
done
for p in "${pids[@]}"; do
  wait "$p" || { rc=$?; echo "sanitize.sh: the native step failed (exit $rc; 124: SELECT_SECONDS ran out):"
                 tail -n 20 "$R"/select-*.txt; exit 1; }
done
cat "$R"/select-*.txt

echo "== the sanitizers: $((SHARDS_MEMCHECK + 2 * SHARDS_SUBSET)) processes per kernel set ($BACKENDS)"
declare -A TOOL=(
  [memcheck]="--tool memcheck --kernel-name kns=portconv_"
  [racecheck]="--tool racecheck --kernel-name kns=portconv_"
  [initcheck]="--tool initcheck"
)
declare -A CACHING=([memcheck]=1 [racecheck]=0 [initcheck]=1)  # PYTORCH_NO_CUDA_MEMORY_CACHING
launch() {  # launch TOOL BACKEND LIST SHARD SHARDS: one sanitized process; NAME.rc gets "exit-status seconds"
  local name="$1-$2-$4" t=$SECONDS
  PYTORCH_NO_CUDA_MEMORY_CACHING=${CACHING[$1]} timeout -k 20 "${SANITIZE_SECONDS:-280}" \
    "$CS" ${TOOL[$1]} --report-api-errors no --print-limit 50 --log-file "$R/$name.log" \
    python3 "$DRIVER" run "$2" "$R/select-$2.json" "$3" "$4/$5" "$R/$name.jsonl" > "$R/$name.out" 2>&1
  echo "$? $((SECONDS - t))" > "$R/$name.rc"
}
for b in $BACKENDS; do
  for ((i = 0; i < SHARDS_MEMCHECK; i++)); do launch memcheck "$b" memcheck "$i" "$SHARDS_MEMCHECK" & done
  for t in racecheck initcheck; do
    for ((i = 0; i < SHARDS_SUBSET; i++)); do launch "$t" "$b" subset "$i" "$SHARDS_SUBSET" & done
  done
done
wait
echo "== done in $((SECONDS - start)) s; exit status and seconds per process:"
for f in "$R"/*.rc; do echo "  $(basename "$f" .rc): $(cat "$f")"; done

python3 "$DRIVER" summary "$R" > "$R/summary.txt" 2>&1; status=$?
cp "$R/summary.md" "$OUT/summary.md" 2>/dev/null
tar -czf "$OUT/sanitize.tar.gz" -C "$R" .
echo "== reports: $OUT/sanitize.tar.gz, $OUT/summary.md"
cat "$R/summary.txt"
exit $status
