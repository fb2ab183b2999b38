#!/bin/bash
# Call 2 of docs/performance/h100-2026-11-26b, kept here as the record of what ran (the maintained way is
# `bash scripts/gpu/reports.sh tox` with the wheels carried in .whl/). `tox -e cuda` and `tox -e hip` as tox runs
# them (Note [device envs] in tox.ini) on the device machine, which has torch and CuPy but no tox and no package
# index: tox, its dependencies and pytest-xdist travel as wheels in out/wheels (run's carry; made with `pip download
# --only-binary=:all: --python-version 3.12 tox pytest-xdist -d out/wheels`, pytest itself removed) and are
# unpacked, not installed. Both envs run at once, their tests spread over pytest-xdist workers (--dist load:
# conformance is one module). Run from the repository root with $OUT set.
set -u
T=/tmp/toxsite X=/tmp/xdist
for w in out/wheels/*.whl; do case $w in *xdist*|*execnet*) d=$X;; *) d=$T;; esac; python3 -m zipfile -e $w $d; done
export PORTCONV_SITE_PACKAGES=$(python3 -c 'import site; print(site.getsitepackages()[0])'):$X
{ python3 -c "import torch, cupy; print('torch', torch.__version__, 'cudnn', torch.backends.cudnn.version(), \
'cupy', cupy.__version__)"; PYTHONPATH=$T python3 -m tox --version; python3 -c "import sys; print(sys.executable)"
  nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; } | tee $OUT/versions.txt
t0=$(date +%s)
run() {  # env, workers
    (PYTHONPATH=$T timeout ${TOX_S:-540} python3 -m tox --workdir /tmp/tox-$1 -e $1 -- -n $2 --dist load \
        > $OUT/tox_$1.txt 2>&1; echo "rc=$? $(( $(date +%s) - t0 )) s" >> $OUT/tox_$1.txt) &
}
run cuda ${CUDA_N:-10}
run hip ${HIP_N:-5}
wait
for e in cuda hip; do echo "== tox -e $e"; grep -E "passed|failed|error" $OUT/tox_$e.txt | tail -3; tail -4 $OUT/tox_$e.txt; done
