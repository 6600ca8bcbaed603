"""The learning claim of model=vla through the CLI: a clone of three expert demos on Meta-World
reach-v3 (state + instruction, the chunk head), then PPO at the settings docs/vla.md recommends,
raises success on the same held-out seeds. Its own file so pytest-xdist can place this ~2-minute
test beside the rest of the suite."""

from __future__ import annotations

import json

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.learning]

QUIET = ["progress=false", "tracking.enabled=false"]
SIM = ["sim=metaworld", "sim.task=reach-v3", "sim.max_episode_steps=100"]
BAR = 0.15  # success points PPO must add; set from the measured spread (docstring)
PPO = ["algo.lr=3e-5", "algo.epochs=4", "algo.minibatch_size=128", "algo.anneal_lr=false",
       "algo.critic_warmup_iters=15", "algo.critic_warmup_lr=1e-3"]


def test_vla_sft_then_ppo_raises_success_on_reach(cli, workdir, learning):
    """A paired comparison on the same 50 held-out seeds: the policy PPO starts from (the clone,
    its action std reset by `init_action_std`) against the one it ends with, both acting as PPO
    trains them (sampled actions; `eval.deterministic=false`), both evaluated inside the one run
    (eval.interval past the last iteration: an evaluation at iteration 0 and the final one).

    Why not the deterministic policy: over seeds 0-4 and the lesser-CPU settings, the mean
    action's held-out success moved by +0.08 to +0.36 at this budget (and fell back after a
    peak on doubling it, seed 1: 0.16 -> 0.38 -> 0.26), so a +15 bar on it held on some draws
    only; keeping RL from losing the clone's deterministic success is issue 36's work. What PPO
    optimises, the sampled policy, rises by the margins in docs/benchmarks.md
    ("Learning-test margins")."""
    res = cli("collect", *SIM, *QUIET, "policy=expert", "only_success=true", "episodes=3", "num_envs=3",
              "output=data", f"seed={learning.seed}")
    assert res.code == 0, res.err
    res = cli("sft", *QUIET, "dataset=data", "model=vla", "model.head=chunk", "model.chunk=4", "algo.epochs=100",
              "algo.minibatch_size=64", "val_fraction=0", "eval.episodes=0", "run_dir=sft", f"seed={learning.seed}")
    assert res.code == 0, res.err
    res = cli("rl", "--algo", "ppo", *QUIET, "init=sft/checkpoints/best", "num_envs=8", "algo.rollout_steps=64",
              "total_steps=28000", *PPO, "eval.episodes=50", "eval.deterministic=false", "eval.interval=1000",
              "run_dir=ppo", f"seed={learning.seed}")
    assert res.code == 0, res.err
    rows = [json.loads(line) for line in (workdir / "ppo" / "metrics.jsonl").read_text().splitlines()]
    start = next(r for r in rows if "eval/success_once" in r)
    assert start["step"] == 0 and start["eval/episodes"] == 50  # the clone, before any update
    tuned = json.loads((workdir / "ppo" / "result.json").read_text())["eval"]
    assert tuned["episodes"] == 50
    cloned = start["eval/success_once"]
    learning.record(tuned["success_once"] - cloned, BAR, cloned=cloned)
    assert tuned["success_once"] >= cloned + BAR, (cloned, tuned["success_once"])
