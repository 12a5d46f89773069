#!/usr/bin/env bash
# Issue #33's GPU measurement on one lent H100/H200, in one line from the repository root:
#   bash benchmarks/gpu_harvest.sh [RUN_DIR] [more benchmarks/gpu_harvest.py options]
# It installs this checkout without dependencies (the side tasks are found by their entry
# points), prints the GPU, and runs benchmarks/gpu_harvest.py (about 6-7 minutes); the JSON goes
# to $OUT (the device tool's folder) when set, else into RUN_DIR.
set -eu
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1 || export PYTHONPATH=$PWD/src
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
python3 -c "from flowride.harvest.task import resolve; resolve('gpu-cnn'); import torch; print('torch', torch.__version__, 'cuda', torch.cuda.is_available())"
run_dir=${1:-/tmp/gpu_harvest}
shift || true
python3 benchmarks/gpu_harvest.py --run-dir "$run_dir" --out "${OUT:-$run_dir}/gpu_harvest.json" "$@"
