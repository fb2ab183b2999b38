#!/usr/bin/env bash
# Issue 31's GPU examples on the device machine (repo root; python3 with a CUDA torch, CuPy, Triton, pybind11, nvcc):
#   bash scripts/gpu/custom_examples.sh
# 1. builds examples/custom_forward_cpp with its CUDA kernel (DWCONV_CUDA=1, nvcc) in place, in the background;
# 2. runs tests/test_custom_gpu.py with --backend cuda: the CuPy kernel (CUDA and HIP-on-NVIDIA), the pybind11 CUDA
#    kernel (built again by the test, in a temporary folder) and the Triton kernel, each checked with check_forward
#    and trained beside PyTorch;
# 3. times each example with `portconv bench --custom` (Note [custom bench]) on MobileNetV2's depthwise rows, CUDA
#    events around each call (host work included) and with --hold-stream (device time alone).
# Everything lands in $OUT: custom_examples.tgz (every log and report) and custom_examples.md (the summary); the
# custom / auto table is printed last. Each step's time limit comes out of one budget (BUDGET_S, default 420 s).
set -uo pipefail
OUT=${OUT:-out}; R=/tmp/custom-examples; mkdir -p "$OUT" "$R"; OUT=$(realpath "$OUT")
START=$(date +%s); BUDGET=${BUDGET_S:-420}
left() {  # seconds left for a step: its cap ($1) or what the budget has left, whichever is less
  local rest=$(( BUDGET - ($(date +%s) - START) )); echo $(( rest < $1 ? rest : $1 ))
}
export PYTHONUNBUFFERED=1 OMP_NUM_THREADS=1 PORTCONV_CACHE_DIR=/tmp/portconv-cache
if ls .whl/*.whl >/dev/null 2>&1; then  # the wheels scripts/gpu/reports.sh carries (pyopencl, tox), if carried
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
fi
export PYTHONPATH="$PWD:/tmp/site"
ROWS=${ROWS:-mbv2-dw3x3,mbv2-dw3x3-s2,mbv2-dw3x3-bf16}
{
  date -u; git log -1 --format='%H %s' 2>/dev/null
  nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv
  python3 -c "import torch, cupy, triton, pybind11, pytest; print('torch', torch.__version__, 'cuda', \
torch.version.cuda, 'cupy', cupy.__version__, 'triton', triton.__version__, 'pybind11', pybind11.__version__, \
'pytest', pytest.__version__)"
  nvcc --version | tail -2
} > "$R/env.txt" 2>&1
cat "$R/env.txt"

( cd examples/custom_forward_cpp && DWCONV_CUDA=1 timeout "$(left 200)" python3 setup.py build_ext --inplace ) \
  > "$R/build.txt" 2>&1 &
build=$!

PORTCONV_POISON=1 timeout "$(left 240)" python3 -m pytest -q -rfEs -p no:cacheprovider -W ignore --backend cuda \
  tests/test_custom_gpu.py > "$R/pytest.txt" 2>&1
echo "== pytest rc=$?"; tail -3 "$R/pytest.txt"
wait "$build"; echo "== build rc=$?"; tail -2 "$R/build.txt"

for ex in cupy:dwconv_cupy:dw_forward cpp:example:dw_forward triton:dwconv_triton:dw_forward; do
  name=${ex%%:*}; op=${ex#*:}
  for mode in events held; do
    t=$(left 60)
    if [ "$t" -lt 15 ]; then echo "== bench $name $mode: not run, the time budget is spent"; continue; fi
    ( cd "examples/custom_forward_$name" && timeout "$t" python3 -m portconv.bench --custom "$op" --rows "$ROWS" \
      --backend cuda --cell-seconds 2 $([ $mode = held ] && echo --hold-stream) --out "$R/bench-$name-$mode" ) \
      > "$R/bench-$name-$mode.txt" 2>&1
    echo "== bench $name $mode rc=$?"
  done
done

# the summary: environment, test results, then per example, row and timing mode the medians and custom / auto
python3 - "$R" > "$R/table.txt" <<'EOF'
import json, pathlib, sys
root = pathlib.Path(sys.argv[1])
print(f"{'example':<8} {'mode':<7} {'row':<18} {'fwd ms custom / auto':<28} {'fwd+bwd ms custom / auto':<28}")
for path in sorted(root.glob("bench-*-*/custom.json")):
    name, mode = path.parent.name.split("-")[1:]
    rep = json.loads(path.read_text())
    for row in rep["rows"]:
        if "skipped" in row:
            print(f"{name:<8} {mode:<7} {row['name']:<18} skipped: {row['skipped']}")
            continue
        cells = []
        for d in ("fwd", "fwd+bwd"):
            c, a = (row["results"][k]["directions"].get(d, {}) for k in ("custom", "auto"))
            ratio = row.get("custom_over_auto", {}).get(d)
            cells.append(f"{c.get('median_ms', float('nan')):.4f} / {a.get('median_ms', float('nan')):.4f} = "
                         + (f"{ratio:.3f}" if ratio else "-"))
        print(f"{name:<8} {mode:<7} {row['name']:<18} {cells[0]:<28} {cells[1]:<28}")
EOF
{
  echo "# Issue 31 GPU examples ($(date -u +%FT%TZ), $(( $(date +%s) - START )) s)"; echo
  echo '```'; cat "$R/env.txt"; echo '```'; echo
  echo "## tests/test_custom_gpu.py --backend cuda"; echo; echo '```'
  grep -E "^(FAILED|ERROR)" "$R/pytest.txt" | cut -c1-220 | head -12; tail -2 "$R/pytest.txt"; echo '```'; echo
  echo "## portconv bench --custom (custom / auto <= 1: as fast as portconv's own forward + backward)"; echo
  echo "events: CUDA events around each call, host work included; held: --hold-stream, device time alone."
  echo; echo '```'; cat "$R/table.txt"; echo '```'
} > "$OUT/custom_examples.md"
tar -czf "$OUT/custom_examples.tgz" -C "$R" .
echo; cat "$R/table.txt"
