"""The learning claim of the flow head (model=mlp model.head=flow, Flow-Noise) through the CLI:
five expert demos of Meta-World reach-v3 (state), cloned by flow matching, then PPO on the
recorded denoising chains raises held-out success."""

from __future__ import annotations

import json

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.learning]

QUIET = ["progress=false", "tracking.enabled=false"]
SIM = ["sim=metaworld", "sim.task=reach-v3", "sim.max_episode_steps=100"]
FLOW = ["model=mlp", "model.head=flow", "model.chunk=4", "model.hidden_sizes=[128,128]"]
PPO = ["algo.lr=5e-5", "algo.epochs=4", "algo.minibatch_size=128", "algo.anneal_lr=false",
       "algo.critic_warmup_iters=10", "algo.critic_warmup_lr=1e-3"]
# Gains measured (benchmarks/learning_margins.py --seeds 0-3, 2026-12-07, from the 0.33 clone, 100
# held-out episodes, 24k PPO steps): this CPU +0.03 / +0.05 / +0.08 / +0.06, avx2-1thread the same,
# no-amx-compat-2threads +0.03 / +0.06 / +0.06 / +0.02. Every run gains; the bar is a gain, not its
# size. At 16k steps and 50 episodes one draw lost 0.02 (no-amx-compat-2threads, seed 0, once the
# runs validated on 10 episodes instead of 5, which moves the RNG): too little room.
HELD_OUT_GAIN = 0.01
EPISODES = 100  # held-out episodes of the clone and of the tuned policy (the same seeds)


def test_flow_sft_then_ppo_raises_success_on_reach(cli, workdir, learning):
    res = cli("collect", *SIM, *QUIET, "policy=expert", "only_success=true", "episodes=5", "num_envs=5",
              "output=data", "seed=0")
    assert res.code == 0, res.err
    res = cli("sft", *QUIET, "dataset=data", *FLOW, "algo.epochs=200", "algo.minibatch_size=64", "val_fraction=0",
              f"eval.episodes={EPISODES}", "run_dir=sft", "seed=0")
    assert res.code == 0, res.err
    cloned = json.loads((workdir / "sft" / "result.json").read_text())["eval"]["success_once"]
    res = cli("rl", "--algo", "ppo", *QUIET, "init=sft/checkpoints/best", "num_envs=8", "algo.rollout_steps=64",
              "total_steps=24000", *PPO, f"eval.episodes={EPISODES}", "run_dir=ppo", f"seed={learning.seed}")
    assert res.code == 0, res.err
    tuned = json.loads((workdir / "ppo" / "result.json").read_text())["eval"]
    assert tuned["episodes"] == EPISODES
    learning.record(tuned["success_once"] - cloned, HELD_OUT_GAIN, cloned=cloned)
    assert tuned["success_once"] >= cloned + HELD_OUT_GAIN, (cloned, tuned["success_once"])
