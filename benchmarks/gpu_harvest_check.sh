#!/usr/bin/env bash
# The CUDA paths of harvesting, on a machine with one GPU (what docs/benchmarks.md records):
#  1. attach on a torch.distributed.pipelining job on cuda:0 (1 rank holding 2 stages, nccl),
#     with and without attach: losses must be identical; the side task (cnn) gets the GPU, its
#     memory cap, and the MPS settings only if an MPS daemon runs;
#  2. a hand-written 1F1B loop with rank 1 on the GPU and rank 0 on the CPU (gloo moves the
#     activations through host memory): real GPU bubbles on rank 1, filled by cnn on the GPU.
# Run from the repository root: bash benchmarks/gpu_harvest_check.sh
set -u
export PYTHONPATH=$PWD/src:$PWD/tests PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
python3 -c "import torch,sys; print('python', sys.version.split()[0], 'torch', torch.__version__, 'cuda', torch.cuda.is_available(), torch.cuda.device_count())"
python3 -c "from flowride.pipeline import torch_compat as tc; tc.check(); print('torch_compat ok:', tc.available_schedules())"
python3 -c "from flowride.harvest.limits import mps_daemon_running as m; print('MPS daemon:', m())"

summary() {  # run dir
  python3 -m flowride tasks list --run-dir "$1"
  python3 - "$1" <<'EOF'
import json, sys
d = json.load(open(f"{sys.argv[1]}/harvest.json"))
print({k: d[k] for k in ("mode", "device", "mps", "events_seen")})
st = d["steps"]
print("side-task steps", len(st), "by stage", {s: sum(1 for x in st if x["stage"] == s) for s in (0, 1)},
      "overruns", sum(1 for x in st if x["overrun_s"] > 0))
EOF
  grep -h "CUDA memory" "$1"/tasks/*.log
}

echo "== profile of the cnn side task on the GPU (what the manager's fits-the-bubble rule uses)"
mkdir -p /tmp/att /tmp/hyb
python3 -m flowride profile-task cnn --params '{"device": "cuda", "total_steps": 10000000}' --out /tmp/cnn.json > /dev/null
python3 -c "import json; p = json.load(open('/tmp/cnn.json')); print('cnn on cuda: median step', round(p['median_step_s'] * 1e3, 2), 'ms'); json.dump({'cnn': p}, open('/tmp/att/task-profiles.json', 'w')); json.dump({'cnn': p}, open('/tmp/hyb/task-profiles.json', 'w'))"

echo "== 1. attach: 1 rank, 2 stages (interleaved1f1b) on cuda:0, nccl"
for arm in "" "--no-harvest"; do
  timeout 240 torchrun --standalone --nproc-per-node 1 examples/torch_pipeline_attach.py --schedule interleaved1f1b \
    --steps 12 --side-tasks cnn --run-dir /tmp/att --out "/tmp/att$arm.json" $arm 2>&1 | grep -E "^rank|Error"
done
cmp /tmp/att.json /tmp/att--no-harvest.json && echo "losses identical with and without attach (CUDA)"
summary /tmp/att

echo "== 2. hand-written 1F1B: rank 0 on the CPU, rank 1 on the GPU; cnn on the GPU in the bubbles"
for arm in "" "--no-harvest"; do
  timeout 300 torchrun --standalone --nproc-per-node 2 examples/handwritten_1f1b.py --gpu-ranks 1 --side-device cuda \
    --side-tasks cnn --steps 30 --width 1024 --run-dir /tmp/hyb --out "/tmp/hyb$arm.json" $arm 2>&1 | grep -E "^rank|Error"
done
cmp /tmp/hyb.json /tmp/hyb--no-harvest.json && echo "losses identical with and without the reporter (hybrid)"
summary /tmp/hyb
for r in 0 1; do python3 -c "import json; a = json.load(open('/tmp/hyb/attach-rank$r.json')); print('rank $r:', a['announced'], 'bubbles announced of', a['waits'], 'waits; median prediction error', a['prediction_error_median'])"; done
