#!/usr/bin/env bash
# rlinf's whole GPU path end to end, as one table (about 6-12 minutes on one GPU for checks 1-9; check 10
# adds a pixel collect, SFT and PPO run: CASES="1 2 3 4 5 6 7 8 9" leaves it out where the time is short).
# Prepared on a CPU-only machine: run it where a CUDA GPU is present, with rlinf and its plugins installed
# (`make install`, or wheels brought in where there is no network).
#
#   bash benchmarks/gpu_check.sh            # every check; exits non-zero if one failed
#   ACCEL=cpu bash benchmarks/gpu_check.sh  # the same commands on the CPU (validates the script itself)
#   CASES="6 7" bash benchmarks/gpu_check.sh # some of the checks only (numbers below)
#
# Checks, each a real run with a pass/fail condition:
#   1. the accelerator plugin detects the device (rlinf doctor)
#   2. PPO with the policy and rollout buffers on the device learns CartPole
#   3. PPO on Meta-World pixels: MuJoCo renders through EGL (on the GPU's driver), a CNN policy on the device
#   4. GRPO on a small language model in bf16 (DeepSpeed ZeRO-2) on an arithmetic task
#   5. DeepSpeed ZeRO-2 with two processes under torchrun (only with >= 2 devices)
#   6. model=vla on the device, bf16 where supported (benchmarks/vla_device_check.py): act and
#      evaluate agree (bf16: 0.05 nats), one PPO step with the torch engine and with DeepSpeed
#      ZeRO-2, the instruction KV cache fresh after it; act ms per step with and without the cache
#   7. `rlinf rl model=vla` on Meta-World, DeepSpeed ZeRO-2 bf16, the policy on the device
#   8. GRPO with 2 generation workers sampling on the device, one weight version behind
#      (placement.generation.workers=2 runtime.max_staleness=1): weights reach the workers after every
#      update (executor=local: through shared memory; CUDA tensors need CUDA IPC there, untried)
#   9. weight sync by broadcast: the same run with placement.generation.sync=broadcast (executor=local:
#      workers share the trainer's GPU, so gloo through the host), then benchmarks/broadcast_check.py:
#      a 135M-parameter version sent by NCCL from GPU 0 to GPU 1 (needs >= 2 devices), bit-equal, timed
#  10. the flow head (pi0-style action expert, model.head=flow, Flow-SDE: the noise mode that learned on
#      the state, docs/vla.md) on the 8 Meta-World tasks
#      of benchmarks/vla_metaworld.py from pixels (rgb + proprio + instruction): the experts collect
#      FLOW_DEMOS demos per task (EGL render), flow-matching SFT bf16 on the device, PPO from the
#      clone (FLOW_PPO_STEPS chunks), both evaluated on 10 held-out seeds per task; passes when the
#      updates are finite and both evaluations ran (the success rates are reported, not required)
#  11. the flow head's training pass with model.flow_batch_steps (benchmarks/flow_steps.py on the
#      device): evaluate + backward on 128 recorded chains, the N denoising steps one call each
#      against all N in one call, MLP and VLA, N = 4 and 10; passes when it ran (the speed-ups are
#      reported: on a CPU they were 0.93-1.60x for the MLP and 0.95-1.04x for the VLA, so the option is off by default until a device says more)
# A passing run on real hardware is what a backend's verified.json may record (see docs/accelerators.md).
set -uo pipefail
cd "$(dirname "$0")/.."
RLINF="${RLINF:-$(command -v rlinf || echo .venv/bin/rlinf)}"
PY="${PY:-$(dirname "$RLINF")/python}"
OUT="${OUT:-$(mktemp -d)}"
mkdir -p "$OUT"
export MUJOCO_GL="${MUJOCO_GL:-egl}" OMP_NUM_THREADS=1
ACCEL="${ACCEL:-cuda}"
CASES="${CASES:-1 2 3 4 5 6 7 8 9 10 11}"  # the checks to run, e.g. CASES="6 7"
BF16=true; [ "$ACCEL" = cpu ] && BF16=false
COMMON=(tracking.enabled=false progress=false quiet=true "accelerator=$ACCEL")
ROWS="$OUT/rows.tsv"; : > "$ROWS"
row() { printf '%s\t%s\t%s\t%s\n' "$1" "$2" "$3" "$4" >> "$ROWS"; echo "$2  $1: $3"; }
field() { "$PY" -c "import json,sys; d=json.load(open(sys.argv[1])); print(eval(sys.argv[2], {}, {'r': d}))" "$1/result.json" "$2" 2>/dev/null; }
want() { case " $CASES " in *" $1 "*) return 0;; *) return 1;; esac; }
timed() { local t0=$SECONDS; "$@" > "$OUT/last.log" 2>&1; local rc=$?; LAST_S=$((SECONDS - t0)); return $rc; }

echo "== rlinf GPU check ($(date -u +%FT%TZ)), accelerator=$ACCEL, outputs in $OUT"
"$RLINF" doctor > "$OUT/doctor.txt" 2>&1; cat "$OUT/doctor.txt"
if want 1; then
if [ "$ACCEL" != cpu ]; then
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader > "$OUT/gpu.txt" 2>&1 || true
  if grep -E "^. $ACCEL " "$OUT/doctor.txt" | grep -qv "not detected"; then
    row "1 $ACCEL detected" PASS "$(head -1 "$OUT/gpu.txt")" 0
  else
    row "1 $ACCEL detected" FAIL "rlinf doctor: $(grep -E "^. $ACCEL " "$OUT/doctor.txt" | head -1)" 0
  fi
fi
fi

if want 2; then
if timed "$RLINF" rl "${COMMON[@]}" sim.env_id=CartPole-v1 total_steps=60000 eval.episodes=10 run_dir="$OUT/ppo"; then
  r=$(field "$OUT/ppo" "r['eval']['return_mean']")
  "$PY" -c "import sys; sys.exit(0 if float('$r') >= 200 else 1)" && row "2 PPO learns CartPole" PASS "eval return $r (>= 200)" $LAST_S \
    || row "2 PPO learns CartPole" FAIL "eval return $r < 200" $LAST_S
else row "2 PPO learns CartPole" FAIL "$(tail -1 "$OUT/last.log")" $LAST_S; fi
fi

if want 3; then
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
fi

if want 4; then
if timed "$RLINF" rl --algo grpo "${COMMON[@]}" sim=arithmetic sim.digits=1 model=hf text.iterations=10 algo.groups=8 \
    algo.group_size=8 algo.epochs=1 train.backend=deepspeed train.zero_stage=2 train.bf16=$BF16 eval.episodes=32 run_dir="$OUT/grpo"; then
  acc=$(field "$OUT/grpo" "r['eval'].get('accuracy')")
  dtype=$("$PY" -c "
from safetensors import safe_open; import sys
with safe_open(sys.argv[1] + '/checkpoints/final/model.safetensors', 'pt') as f: print(f.get_tensor(next(iter(f.keys()))).dtype)" "$OUT/grpo" 2>/dev/null)
  [ -n "$acc" ] && row "4 GRPO, small LM, ZeRO-2 bf16=$BF16" PASS "accuracy $acc after 10 iterations, weights $dtype" $LAST_S \
    || row "4 GRPO, small LM, ZeRO-2 bf16=$BF16" FAIL "no accuracy in result.json" $LAST_S
else row "4 GRPO, small LM, ZeRO-2 bf16=$BF16" FAIL "$(tail -1 "$OUT/last.log")" $LAST_S; fi
fi

if want 5; then
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
fi

if want 6; then
# 6: the VLA's own numbers on the device (bf16 where the accelerator supports it; fp32 on the CPU)
vla_ok=0; vla_detail=""; vla_s=0
for backend in torch deepspeed; do
  if timed "$PY" benchmarks/vla_device_check.py --accelerator "$ACCEL" --bf16 auto --backend "$backend"; then
    vla_detail+="$backend: $("$PY" -c "
import json, sys
rs = [json.loads(x) for x in open(sys.argv[1]) if x.startswith('{')]
gap = max(max(v for k, v in r.items() if k.endswith('act_vs_evaluate_logp')) for r in rs)
t = {r['head']: r for r in rs}['tokens']
print(f\"{rs[0]['dtype']} max |act-evaluate| {gap:.1e} nats (tol {rs[0]['tol']}), tokens act {t['act_ms_cached']} ms cached / {t['act_ms_full']} ms full\")" "$OUT/last.log"); "
  else
    vla_ok=1; vla_detail+="$backend: $(grep -h '^{' "$OUT/last.log" | grep -o '"head": "[a-z]*".*"ok": false' | head -1 | cut -c1-160) / $(tail -1 "$OUT/last.log" | cut -c1-120); "
  fi
  cp "$OUT/last.log" "$OUT/vla_$backend.log"; vla_s=$((vla_s + LAST_S))
done
[ $vla_ok = 0 ] && row "6 VLA act = evaluate, PPO step, fresh cache" PASS "$vla_detail" $vla_s \
  || row "6 VLA act = evaluate, PPO step, fresh cache" FAIL "$vla_detail" $vla_s
fi

if want 7; then
if timed "$RLINF" rl "${COMMON[@]}" sim=metaworld sim.task=reach-v3 sim.reward=shaped sim.max_episode_steps=50 model=vla \
    num_envs=4 algo.rollout_steps=32 total_steps=256 eval.episodes=2 train.backend=deepspeed train.zero_stage=2 \
    train.bf16=$BF16 run_dir="$OUT/vla_rl"; then
  kl=$("$PY" -c "
import json, math, sys
m = [json.loads(x) for x in open(sys.argv[1] + '/metrics.jsonl')]
s = [x for x in m if 'train/approx_kl' in x]
assert len(s) == 2 and all(math.isfinite(x['train/approx_kl']) and x['train/grad_norm'] > 0 for x in s)
print(f\"{s[-1]['train/approx_kl']:.1e}\")" "$OUT/vla_rl" 2>/dev/null)
  [ -n "$kl" ] && row "7 rl model=vla, ZeRO-2 bf16=$BF16" PASS "2 PPO iterations, approx KL $kl, eval $(field "$OUT/vla_rl" "r['eval']['episodes']") episodes" $LAST_S \
    || row "7 rl model=vla, ZeRO-2 bf16=$BF16" FAIL "no finite PPO update in metrics.jsonl" $LAST_S
else row "7 rl model=vla, ZeRO-2 bf16=$BF16" FAIL "$(tail -1 "$OUT/last.log")" $LAST_S; fi
fi

if want 8; then
if timed "$RLINF" rl --algo grpo "${COMMON[@]}" sim=arithmetic sim.digits=2 model=hf text.iterations=4 algo.groups=4 \
    algo.group_size=4 eval.episodes=8 placement.generation.workers=2 runtime.max_staleness=1 run_dir="$OUT/gen_workers"; then
  lag=$("$PY" -c "
import json, sys
m = [json.loads(x) for x in open(sys.argv[1] + '/metrics.jsonl')]
lag = [x['rollout/weight_version_lag'] for x in m if 'rollout/weight_version_lag' in x]
sync = [x['time/weight_sync_s'] for x in m if 'time/weight_sync_s' in x]
assert lag == [0.0, 1.0, 1.0, 1.0], lag
print(f'lag {lag}, weight sync {max(sync) * 1e3:.0f} ms at most')" "$OUT/gen_workers" 2>/dev/null)
  [ -n "$lag" ] && row "8 generation workers, max_staleness=1" PASS "$lag" $LAST_S \
    || row "8 generation workers, max_staleness=1" FAIL "weight_version_lag not [0, 1, 1, 1] in metrics.jsonl" $LAST_S
else row "8 generation workers, max_staleness=1" FAIL "$(tail -1 "$OUT/last.log")" $LAST_S; fi
fi

if want 9; then
# not quiet: the run's "sampling: ..." note says which collective carried the weights
if timed "$RLINF" rl --algo grpo tracking.enabled=false progress=false "accelerator=$ACCEL" sim=arithmetic sim.digits=2 \
    model=hf text.iterations=4 algo.groups=4 algo.group_size=4 eval.episodes=8 placement.generation.workers=2 \
    placement.generation.sync=broadcast run_dir="$OUT/gen_bcast"; then
  detail=$(grep -o 'weights by [a-z]* broadcast' "$OUT/last.log" | head -1)
  [ -n "$detail" ] && row "9a generation workers, sync=broadcast" PASS "$detail, $(field "$OUT/gen_bcast" "r['eval'].get('accuracy')") accuracy" $LAST_S \
    || row "9a generation workers, sync=broadcast" FAIL "no 'weights by ... broadcast' line" $LAST_S
else row "9a generation workers, sync=broadcast" FAIL "$(tail -1 "$OUT/last.log")" $LAST_S; fi
backend=nccl; [ "$ACCEL" = cpu ] && backend=gloo
if timed "$PY" benchmarks/broadcast_check.py --backend $backend --receivers 1 --dtype bfloat16; then
  if grep -q '^SKIP' "$OUT/last.log"; then row "9b $backend weight broadcast, 135M" SKIP "$(tail -1 "$OUT/last.log")" $LAST_S
  else row "9b $backend weight broadcast, 135M" PASS "$(tail -1 "$OUT/last.log")" $LAST_S; fi
else row "9b $backend weight broadcast, 135M" FAIL "$(tail -1 "$OUT/last.log")" $LAST_S; fi
fi

if want 10; then
FLOW_DEMOS="${FLOW_DEMOS:-3}"; FLOW_SFT_EPOCHS="${FLOW_SFT_EPOCHS:-100}"; FLOW_PPO_STEPS="${FLOW_PPO_STEPS:-8000}"
[ "$ACCEL" = cpu ] && { FLOW_DEMOS=1; FLOW_SFT_EPOCHS=2; FLOW_PPO_STEPS=256; }  # the CPU validates the commands only
TASKS8=reach-v3,push-v3,drawer-close-v3,drawer-open-v3,button-press-topdown-v3,window-open-v3,window-close-v3,door-open-v3
PIX=(sim=metaworld "sim.tasks=[$TASKS8]" sim.obs=state_rgb sim.max_episode_steps=100)
FLOW=(model=vla model.head=flow model.chunk=4 model.flow_steps=4 model.flow_noise=sde "model.obs_keys=[rgb,proprio,instruction]" train.bf16=$BF16)
t10=$SECONDS; flow_detail=""
if timed "$RLINF" collect "${COMMON[@]}" "${PIX[@]}" policy=expert only_success=true episodes=$((8 * FLOW_DEMOS)) \
      num_envs=8 output="$OUT/flow_data" run_dir="$OUT/flow_collect" \
   && timed "$RLINF" sft "${COMMON[@]}" dataset="$OUT/flow_data" "${FLOW[@]}" algo.epochs=$FLOW_SFT_EPOCHS \
      algo.minibatch_size=64 val_fraction=0 eval.episodes=80 run_dir="$OUT/flow_sft" \
   && timed "$RLINF" rl --algo ppo "${COMMON[@]}" init="$OUT/flow_sft/checkpoints/best" num_envs=16 algo.rollout_steps=64 \
      total_steps=$FLOW_PPO_STEPS algo.lr=3e-5 algo.epochs=4 algo.minibatch_size=128 algo.anneal_lr=false \
      algo.critic_warmup_iters=5 algo.critic_warmup_lr=1e-3 algo.target_kl=0.02 train.bf16=$BF16 eval.episodes=80 \
      run_dir="$OUT/flow_ppo"; then
  flow_detail=$("$PY" -c "
import json, math, sys
m = [json.loads(x) for x in open(sys.argv[2] + '/metrics.jsonl')]
s = [x for x in m if 'train/approx_kl' in x]
assert s and all(math.isfinite(x['train/approx_kl']) for x in s)
sft, ppo = (json.load(open(d + '/result.json'))['eval']['success_once'] for d in sys.argv[1:3])
print(f'8 tasks from pixels: flow SFT {sft:.0%} -> PPO Flow-SDE {ppo:.0%} (80 held-out episodes each), {len(s)} PPO iterations')
" "$OUT/flow_sft" "$OUT/flow_ppo" 2>/dev/null)
  [ -n "$flow_detail" ] && row "10 flow head, 8 tasks from pixels" PASS "$flow_detail" $((SECONDS - t10)) \
    || row "10 flow head, 8 tasks from pixels" FAIL "no finite PPO update or no evaluation in the run dirs" $((SECONDS - t10))
else row "10 flow head, 8 tasks from pixels" FAIL "$(tail -1 "$OUT/last.log")" $((SECONDS - t10)); fi
fi

if want 11; then
t11=$SECONDS
if timed "$PY" benchmarks/flow_steps.py --accelerator "$ACCEL" --models mlp vla --steps 4 10 --repeats 10 \
      --train-rows 128 --noise sde; then
  cp "$OUT/last.log" "$OUT/flow_steps.txt"
  # speed-ups of the evaluate + backward tables, MLP then VLA
  ups=$(grep -E '^\| flow N=[0-9]+ \|.*x \|$' "$OUT/flow_steps.txt" | sed -E 's/^\| flow (N=[0-9]+) .* ([0-9.]+x) \|$/\1 \2/' | paste -sd, -)
  [ -n "$ups" ] && row "11 flow_batch_steps, evaluate + backward" PASS "speed-up of one call for N steps (mlp, then vla): $ups" $((SECONDS - t11)) \
    || row "11 flow_batch_steps, evaluate + backward" FAIL "no evaluate table in $OUT/flow_steps.txt" $((SECONDS - t11))
else row "11 flow_batch_steps, evaluate + backward" FAIL "$(tail -1 "$OUT/last.log")" $((SECONDS - t11)); fi
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
