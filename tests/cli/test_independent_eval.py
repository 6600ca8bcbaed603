"""rlinf's evaluation against benchmarks/independent_eval.py, an evaluator that shares none of its
code (the actor's weights in numpy, the checkpoint's normalizer statistics, plain gymnasium): the
same held-out episodes must give the same returns, for a normalized Gaussian policy (PPO) and a
tanh-squashed one on bounds other than +-1 (SAC on Pendulum, actions in [-2, 2])."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import RLINF

pytestmark = pytest.mark.numerics  # results depend on CPU features: make test-portable runs them again

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "independent_eval.py"
QUIET = ["tracking.enabled=false", "progress=false", "quiet=true"]


def _ok(cmd: list[str]) -> subprocess.CompletedProcess:
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    return res


@pytest.mark.parametrize("task,train", [
    ("Hopper-v5", ["algo=ppo", "total_steps=4096", "num_envs=4", "algo.rollout_steps=256", "algo.epochs=2"]),
    ("Pendulum-v1", ["algo=sac", "total_steps=600", "num_envs=1", "algo.rollout_steps=1", "algo.warmup_steps=200",
                     "algo.minibatch_size=64", "model.hidden_sizes=[32,32]", "model.activation=relu"]),
])
def test_rlinf_eval_matches_an_evaluator_outside_rlinf(workdir, task, train):
    _ok([RLINF, "rl", f"sim.env_id={task}", *train, "eval.episodes=2", *QUIET, "run_dir=run"])
    ckpt = workdir / "run/checkpoints/final"
    assert (ckpt / "normalizer.safetensors").is_file() == (task == "Hopper-v5")  # auto: on for PPO, off for SAC
    _ok([RLINF, "eval", f"checkpoint={ckpt}", "episodes=4", "seed=1000000", "num_envs=1", *QUIET, "run_dir=ev"])
    ours = json.loads((workdir / "ev/result.json").read_text())
    theirs = json.loads(_ok([sys.executable, str(SCRIPT), str(ckpt), "--episodes", "4",  # the task from the checkpoint
                             "--seed", "1000000"]).stdout.strip().splitlines()[-1])
    assert theirs["task"] == task
    # another task's shapes, or no such task: one line each
    other = "Pendulum-v1" if task == "Hopper-v5" else "Hopper-v5"
    for bad, says in ((other, "was it trained on another task?"), ("NoSuchTask-v9", "cannot make gymnasium task")):
        res = subprocess.run([sys.executable, str(SCRIPT), str(ckpt), "--task", bad], capture_output=True, text=True,
                             timeout=120)
        assert res.returncode == 2 and says in res.stderr and "Traceback" not in res.stderr, res.stderr
    assert [e["ret"] for e in ours["per_episode"]] == pytest.approx(theirs["returns"], abs=0.051)  # theirs: 0.1
    assert ours["eval"]["return_mean"] == pytest.approx(theirs["return_mean"], abs=1e-3)


def test_not_a_checkpoint_is_one_line(workdir):
    res = subprocess.run([sys.executable, str(SCRIPT), str(workdir), "--task", "Hopper-v5"], capture_output=True,
                         text=True, timeout=120)
    assert res.returncode == 2 and "not an rl checkpoint" in res.stderr and "Traceback" not in res.stderr
