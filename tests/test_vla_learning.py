"""The learning claim of model=vla through the CLI: a clone of three expert demos on Meta-World
reach-v3 (state + instruction, the chunk head), then PPO at the settings docs/vla.md recommends,
raises the success of the episodes it trains on and keeps the clone's held-out success. Its own
file so pytest-xdist can place this ~3-minute test beside the rest of the suite."""

from __future__ import annotations

import json

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.learning]

QUIET = ["progress=false", "tracking.enabled=false"]
SIM = ["sim=metaworld", "sim.task=reach-v3", "sim.max_episode_steps=100"]
# Success PPO must add on the episodes it trains on (sampled actions), its last 15 iterations
# against the 15 critic warm-up iterations (the clone acting, its actor frozen), and how far the
# deterministic policy's held-out success may fall below the clone's (a collapse, not noise).
# Measured over seeds 0-4 and the lesser-CPU settings: docs/benchmarks.md, "Learning-test margins".
TRAIN_GAIN = 0.05
HELD_OUT_DROP = 0.15
PPO = ["algo.lr=3e-5", "algo.epochs=4", "algo.minibatch_size=128", "algo.anneal_lr=false",
       "algo.critic_warmup_iters=15", "algo.critic_warmup_lr=1e-3"]


def test_vla_sft_then_ppo_raises_success_on_reach(cli, workdir, learning):
    """PPO raises the success of the cloned VLA on the episodes it trains on, and its final
    deterministic policy keeps the clone's success on 50 held-out seeds.

    Why these two statistics (measured, docs/benchmarks.md): over seeds 0-3 on this CPU and the
    lesser-CPU settings, the held-out deterministic success moved by -0.06 to +0.28 at this
    budget (a good clone, 46-56%, gained nothing; a +15 bar on it held on some draws only, and a
    Zen 4 failed it), while the training episodes' success rose by +0.12 to +0.32 on every draw.
    Keeping RL from losing a good clone's held-out success is issue 36's work; this test holds the
    learning claim that is true on every draw, and catches a collapse."""
    res = cli("collect", *SIM, *QUIET, "policy=expert", "only_success=true", "episodes=3", "num_envs=3",
              "output=data", "seed=0")
    assert res.code == 0, res.err
    res = cli("sft", *QUIET, "dataset=data", "model=vla", "model.head=chunk", "model.chunk=4", "algo.epochs=100",
              "algo.minibatch_size=64", "val_fraction=0", "eval.episodes=50", "run_dir=sft", "seed=0")
    assert res.code == 0, res.err
    cloned = json.loads((workdir / "sft" / "result.json").read_text())["eval"]["success_once"]
    res = cli("rl", "--algo", "ppo", *QUIET, "init=sft/checkpoints/best", "num_envs=8", "algo.rollout_steps=64",
              "total_steps=28000", *PPO, "eval.episodes=50", "run_dir=ppo", f"seed={learning.seed}")
    assert res.code == 0, res.err
    tuned = json.loads((workdir / "ppo" / "result.json").read_text())["eval"]
    assert tuned["episodes"] == 50
    rows = [json.loads(line) for line in (workdir / "ppo" / "metrics.jsonl").read_text().splitlines()]
    train = [(r["iteration"], r["rollout/success_once"]) for r in rows if "rollout/success_once" in r]
    warm_iters = int(dict(x.split("=") for x in PPO)["algo.critic_warmup_iters"])
    warm = [v for i, v in train if i <= warm_iters]
    last = [v for i, v in train if i > train[-1][0] - warm_iters]
    assert len(warm) == len(last) == warm_iters
    gain = sum(last) / len(last) - sum(warm) / len(warm)
    learning.record(gain, TRAIN_GAIN, warm=sum(warm) / len(warm), held_out_gain=tuned["success_once"] - cloned,
                    cloned=cloned)
    assert gain >= TRAIN_GAIN, (warm, last)
    assert tuned["success_once"] >= cloned - HELD_OUT_DROP, (cloned, tuned["success_once"])
