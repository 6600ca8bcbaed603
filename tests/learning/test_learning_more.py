"""PPO on continuous control tasks (MuJoCo, MountainCarContinuous); GRPO against the random policy."""

from __future__ import annotations

import json

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.learning]


def test_ppo_reaches_900_on_inverted_pendulum(cli, workdir, learning):
    """`rlinf rl sim.env_id=InvertedPendulum-v5`: the task's recommended budget (150k steps)."""
    res = cli("rl", "--algo", "ppo", "sim.env_id=InvertedPendulum-v5", "eval.episodes=10",
              "run_dir=run", "tracking.enabled=false", "progress=false", f"seed={learning.seed}")
    assert res.code == 0, res.err
    ev = json.loads((workdir / "run" / "result.json").read_text())["eval"]
    learning.record(ev["return_mean"], 900)
    assert ev["return_mean"] >= 900, ev


def test_ppo_defaults_solve_mountain_car_continuous(cli, workdir, learning):
    """The +100 at the flag against -0.1 a^2 per step: without normalization PPO settles on not
    pushing (return ~0, docs/benchmarks.md); the default (env.normalize_*=auto, on for gymnasium's
    state-based continuous control) scales rewards by the return's std, and it swings up."""
    res = cli("rl", "sim.env_id=MountainCarContinuous-v0", "total_steps=60000", "eval.episodes=10",
              "run_dir=run", "tracking.enabled=false", "progress=false", f"seed={learning.seed}")
    assert res.code == 0, res.err
    assert "=auto -> on" in res.err
    ev = json.loads((workdir / "run" / "result.json").read_text())["eval"]
    learning.record(ev["return_mean"], 90)
    assert ev["return_mean"] > 90, ev


def test_grpo_triples_the_random_return_on_cartpole(cli, workdir, learning):
    rnd = cli("eval", "checkpoint=random", "episodes=30", "output=random.json", "tracking.enabled=false")
    assert rnd.code == 0, rnd.err
    random_ret = json.loads((workdir / "random.json").read_text())["eval"]["return_mean"]
    res = cli("rl", "--algo", "grpo", "total_steps=60000", "model.critic=false", "eval.episodes=20",
              "run_dir=run", "tracking.enabled=false", "progress=false", f"seed={learning.seed}")
    assert res.code == 0, res.err
    grpo_ret = json.loads((workdir / "run" / "result.json").read_text())["eval"]["return_mean"]
    learning.record(grpo_ret / random_ret, 3)
    assert grpo_ret >= 3 * random_ret, (grpo_ret, random_ret)
