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
# Success points PPO must add, measured over RL seeds 0-4 on this CPU and 5 draws under the
# lesser-CPU settings (docs/benchmarks.md, "Learning-test margins"): on the 50 held-out seeds,
# deterministic, +0.10 to +0.36 (median +0.20); on the episodes it trains on (sampled; its last 15
# iterations against the 15 critic warm-up iterations, the clone acting), +0.17 to +0.37.
HELD_OUT_GAIN = 0.05
TRAIN_GAIN = 0.05
PPO = ["algo.lr=3e-5", "algo.epochs=4", "algo.minibatch_size=128", "algo.anneal_lr=false",
       "algo.critic_warmup_iters=15", "algo.critic_warmup_lr=1e-3"]


def test_vla_sft_then_ppo_raises_success_on_reach(cli, workdir, learning):
    """PPO raises a cloned VLA's success on 50 held-out seeds and on the episodes it trains on.

    One clone (the demos and SFT at seed 0), the RL seed varied: the question is whether PPO lifts
    this clone, not whether three demos of another draw leave room to lift. With the demos drawn
    per seed too, the clone ranged 16-56% and a good clone (46-56%) gained -0.12 to +0.08 on the
    held-out seeds at this budget, while weak ones gained up to +0.36: a +15 bar held on some
    draws only (and failed on a Zen 4). Keeping RL from losing a good clone is issue 36's work."""
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
    learning.record(tuned["success_once"] - cloned, HELD_OUT_GAIN, cloned=cloned, train_gain=gain,
                    warm=sum(warm) / len(warm))
    assert tuned["success_once"] >= cloned + HELD_OUT_GAIN, (cloned, tuned["success_once"])
    assert gain >= TRAIN_GAIN, (warm, last)
