#!/usr/bin/env bash
# One short end-to-end check of rlinf's GPU path (about 5 minutes on one GPU). Prepared on a
# CPU-only machine: run it where a CUDA GPU is present, with rlinf and its plugins installed
# (`make install`, or wheels brought in where there is no network).
#
#   bash benchmarks/gpu_check.sh            # exits non-zero at the first failing check
#   ACCEL=cpu bash benchmarks/gpu_check.sh  # the same commands on the CPU (validates the script itself)
#
# Checks, each a real run with a pass/fail condition:
#   1. the cuda accelerator plugin detects the GPU (rlinf doctor)
#   2. PPO with the policy and rollout buffers on the GPU learns CartPole
#   3. DeepSpeed ZeRO-2 with bf16 on the GPU trains the embodied PPO path and saves a checkpoint
#   4. DeepSpeed ZeRO-3, two ranks under torchrun (only with >= 2 GPUs)
#   5. pixel observations rendered by MuJoCo through EGL, a CNN policy acting on the GPU
set -euo pipefail
cd "$(dirname "$0")/.."
RLINF="${RLINF:-$(command -v rlinf || echo .venv/bin/rlinf)}"
PY="${PY:-$(dirname "$RLINF")/python}"
OUT="${OUT:-$(mktemp -d)}"
mkdir -p "$OUT"
export MUJOCO_GL="${MUJOCO_GL:-egl}" OMP_NUM_THREADS=1
ACCEL="${ACCEL:-cuda}"
BF16=true; [ "$ACCEL" = cpu ] && BF16=false
COMMON=(tracking.enabled=false progress=false quiet=true "accelerator=$ACCEL")
pass() { echo "PASS  $1"; }
fail() { echo "FAIL  $1"; exit 1; }
ret() { "$PY" -c "import json,sys; print(json.load(open(sys.argv[1]))['eval']['return_mean'])" "$1/result.json"; }

echo "== rlinf GPU check ($(date -u +%FT%TZ)), accelerator=$ACCEL, outputs in $OUT"
"$RLINF" doctor | tee "$OUT/doctor.txt"
if [ "$ACCEL" = cuda ]; then
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || fail "nvidia-smi"
  "$PY" -c "import torch; assert torch.cuda.is_available(), 'no CUDA in torch'; print('torch', torch.__version__, torch.cuda.get_device_name(0))"
  grep -E "^. cuda " "$OUT/doctor.txt" | grep -v "not available" | grep -q "available" \
    && pass "1 cuda accelerator detected" || fail "1 cuda accelerator not detected"
fi

"$RLINF" rl "${COMMON[@]}" sim.env_id=CartPole-v1 total_steps=60000 eval.episodes=10 run_dir="$OUT/ppo_cuda" >/dev/null
r=$(ret "$OUT/ppo_cuda")
"$PY" -c "import sys; sys.exit(0 if float('$r') >= 200 else 1)" && pass "2 PPO on $ACCEL learns CartPole (eval return $r)" \
  || fail "2 PPO on cuda: eval return $r < 200"

"$RLINF" rl "${COMMON[@]}" sim.env_id=CartPole-v1 total_steps=8192 eval.episodes=5 train.backend=deepspeed \
  train.zero_stage=2 train.bf16=$BF16 run_dir="$OUT/ds_bf16" >/dev/null
test -s "$OUT/ds_bf16/checkpoints/final/model.safetensors" && pass "3 DeepSpeed ZeRO-2 (bf16=$BF16) on $ACCEL (eval return $(ret "$OUT/ds_bf16"))" \
  || fail "3 DeepSpeed ZeRO-2 bf16: no checkpoint"

ngpu=$("$PY" -c "import torch; print(torch.cuda.device_count() if '$ACCEL' == 'cuda' else 0)")
if [ "$ngpu" -ge 2 ]; then
  "$(dirname "$RLINF")/torchrun" --standalone --nproc_per_node=2 "$RLINF" rl "${COMMON[@]}" sim.env_id=CartPole-v1 \
    total_steps=16384 eval.episodes=5 train.backend=deepspeed train.zero_stage=3 run_dir="$OUT/ds_z3_2gpu" >/dev/null
  pass "4 DeepSpeed ZeRO-3 on 2 GPUs (eval return $(ret "$OUT/ds_z3_2gpu"))"
else
  echo "SKIP  4 DeepSpeed ZeRO-3 on 2 GPUs: $ngpu GPU(s) here"
fi

"$RLINF" rl "${COMMON[@]}" sim.env_id=InvertedPendulum-v5 sim.obs=rgb model.obs_keys=[rgb] total_steps=4096 \
  eval.episodes=2 runtime.mode=hybrid run_dir="$OUT/pixels" >/dev/null
"$PY" - "$OUT/pixels" <<'PY' && pass "5 pixel observations (EGL) + CNN policy on $ACCEL, hybrid runtime" || fail "5 pixel path"
import json, sys
m = [json.loads(x) for x in open(sys.argv[1] + "/metrics.jsonl")]
steps = [x for x in m if "time/rollout_s" in x]
assert steps and steps[-1]["env_steps"] >= 4096, "no training iterations"
print("      pixel rollout env-steps/s:", round(steps[-1]["env_steps"] / sum(x["time/rollout_s"] for x in steps)))
PY
"$PY" benchmarks/rollout_throughput.py --tasks InvertedPendulum-v5:rgb --repeats 1 --pixel-steps 32 --no-gym
echo "== all GPU checks passed"
