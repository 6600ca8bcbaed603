#!/usr/bin/env bash
# rlinf's whole GPU path end to end, as one table (about 5-10 minutes on one GPU). Prepared on a
# CPU-only machine: run it where a CUDA GPU is present, with rlinf and its plugins installed
# (`make install`, or wheels brought in where there is no network).
#
#   bash benchmarks/gpu_check.sh            # every check; exits non-zero if one failed
#   ACCEL=cpu bash benchmarks/gpu_check.sh  # the same commands on the CPU (validates the script itself)
#
# Checks, each a real run with a pass/fail condition:
#   1. the accelerator plugin detects the device (rlinf doctor)
#   2. PPO with the policy and rollout buffers on the device learns CartPole
#   3. PPO on Meta-World pixels: MuJoCo renders through EGL (on the GPU's driver), a CNN policy on the device
#   4. GRPO on a small language model in bf16 (DeepSpeed ZeRO-2) on an arithmetic task
#   5. DeepSpeed ZeRO-2 with two processes under torchrun (only with >= 2 devices)
# A passing run on real hardware is what a backend's verified.json may record (see docs/accelerators.md).
set -uo pipefail
cd "$(dirname "$0")/.."
RLINF="${RLINF:-$(command -v rlinf || echo .venv/bin/rlinf)}"
PY="${PY:-$(dirname "$RLINF")/python}"
OUT="${OUT:-$(mktemp -d)}"
mkdir -p "$OUT"
export MUJOCO_GL="${MUJOCO_GL:-egl}" OMP_NUM_THREADS=1
ACCEL="${ACCEL:-cuda}"
BF16=true; [ "$ACCEL" = cpu ] && BF16=false
COMMON=(tracking.enabled=false progress=false quiet=true "accelerator=$ACCEL")
ROWS="$OUT/rows.tsv"; : > "$ROWS"
row() { printf '%s\t%s\t%s\t%s\n' "$1" "$2" "$3" "$4" >> "$ROWS"; echo "$2  $1: $3"; }
field() { "$PY" -c "import json,sys; d=json.load(open(sys.argv[1])); print(eval(sys.argv[2], {}, {'r': d}))" "$1/result.json" "$2" 2>/dev/null; }
timed() { local t0=$SECONDS; "$@" > "$OUT/last.log" 2>&1; local rc=$?; LAST_S=$((SECONDS - t0)); return $rc; }

echo "== rlinf GPU check ($(date -u +%FT%TZ)), accelerator=$ACCEL, outputs in $OUT"
"$RLINF" doctor > "$OUT/doctor.txt" 2>&1; cat "$OUT/doctor.txt"
if [ "$ACCEL" != cpu ]; then
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader > "$OUT/gpu.txt" 2>&1 || true
  if grep -E "^. $ACCEL " "$OUT/doctor.txt" | grep -qv "not detected"; then
    row "1 $ACCEL detected" PASS "$(head -1 "$OUT/gpu.txt")" 0
  else
    row "1 $ACCEL detected" FAIL "rlinf doctor: $(grep -E "^. $ACCEL " "$OUT/doctor.txt" | head -1)" 0
  fi
fi

if timed "$RLINF" rl "${COMMON[@]}" sim.env_id=CartPole-v1 total_steps=60000 eval.episodes=10 run_dir="$OUT/ppo"; then
  r=$(field "$OUT/ppo" "r['eval']['return_mean']")
  "$PY" -c "import sys; sys.exit(0 if float('$r') >= 200 else 1)" && row "2 PPO learns CartPole" PASS "eval return $r (>= 200)" $LAST_S \
    || row "2 PPO learns CartPole" FAIL "eval return $r < 200" $LAST_S
else row "2 PPO learns CartPole" FAIL "$(tail -1 "$OUT/last.log")" $LAST_S; fi

if timed "$RLINF" rl "${COMMON[@]}" sim=metaworld sim.task=reach-v3 sim.obs=rgb sim.image_size=84 sim.max_episode_steps=100 \
    model.obs_keys=[rgb,proprio] num_envs=8 total_steps=8192 eval.episodes=4 eval.video=1 runtime.mode=hybrid run_dir="$OUT/pixels"; then
  sps=$("$PY" -c "
import json, sys
m = [json.loads(x) for x in open(sys.argv[1] + '/metrics.jsonl')]
s = [x for x in m if 'time/rollout_s' in x]
assert s and s[-1]['env_steps'] >= 8192
print(round(s[-1]['env_steps'] / sum(x['time/rollout_s'] for x in s)))" "$OUT/pixels" 2>/dev/null)
  [ -n "$sps" ] && row "3 PPO on Meta-World pixels (EGL render)" PASS "$sps pixel env-steps/s in rollouts, 1 eval video" $LAST_S \
    || row "3 PPO on Meta-World pixels (EGL render)" FAIL "no training iterations" $LAST_S
else row "3 PPO on Meta-World pixels (EGL render)" FAIL "$(tail -1 "$OUT/last.log")" $LAST_S; fi

if timed "$RLINF" rl --algo grpo "${COMMON[@]}" sim=arithmetic sim.digits=1 model=hf text.iterations=10 algo.groups=8 \
    algo.group_size=8 algo.epochs=1 train.backend=deepspeed train.zero_stage=2 train.bf16=$BF16 eval.episodes=32 run_dir="$OUT/grpo"; then
  acc=$(field "$OUT/grpo" "r['eval'].get('accuracy')")
  dtype=$("$PY" -c "
from safetensors import safe_open; import sys
with safe_open(sys.argv[1] + '/checkpoints/final/model.safetensors', 'pt') as f: print(f.get_tensor(next(iter(f.keys()))).dtype)" "$OUT/grpo" 2>/dev/null)
  [ -n "$acc" ] && row "4 GRPO, small LM, ZeRO-2 bf16=$BF16" PASS "accuracy $acc after 10 iterations, weights $dtype" $LAST_S \
    || row "4 GRPO, small LM, ZeRO-2 bf16=$BF16" FAIL "no accuracy in result.json" $LAST_S
else row "4 GRPO, small LM, ZeRO-2 bf16=$BF16" FAIL "$(tail -1 "$OUT/last.log")" $LAST_S; fi

ndev=$("$PY" -c "
from rlinf_cli.registry import get_registry
print(get_registry().load('accelerator', '$ACCEL')().device_count() if '$ACCEL' != 'cpu' else 0)" 2>/dev/null || echo 0)
if [ "${ndev:-0}" -ge 2 ]; then
  if timed "$(dirname "$RLINF")/torchrun" --standalone --nproc_per_node=2 "$RLINF" rl "${COMMON[@]}" sim.env_id=CartPole-v1 \
      total_steps=16384 eval.episodes=5 train.backend=deepspeed train.zero_stage=2 train.bf16=$BF16 run_dir="$OUT/ds_2proc"; then
    row "5 DeepSpeed ZeRO-2, 2 processes" PASS "eval return $(field "$OUT/ds_2proc" "r['eval']['return_mean']")" $LAST_S
  else row "5 DeepSpeed ZeRO-2, 2 processes" FAIL "$(tail -1 "$OUT/last.log")" $LAST_S; fi
else
  row "5 DeepSpeed ZeRO-2, 2 processes" SKIP "${ndev:-0} $ACCEL device(s) here" 0
fi

echo
echo "== rlinf GPU check, accelerator=$ACCEL, $(date -u +%F)"
"$PY" - "$ROWS" <<'PY'
import sys
rows = [l.rstrip("\n").split("\t") for l in open(sys.argv[1])]
w = max(len(r[0]) for r in rows)
print(f"| {'check':<{w}} | result | detail | s |\n|{'-' * (w + 2)}|--------|--------|---|")
for name, result, detail, secs in rows:
    print(f"| {name:<{w}} | {result:<6} | {detail} | {secs} |")
PY
! grep -q "	FAIL	" "$ROWS"
