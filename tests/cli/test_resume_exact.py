"""Checkpoints never change training, and a run killed with SIGKILL and resumed from its last
checkpoint writes exactly the metrics of a run that was never interrupted.

CartPole episodes last 10-500 steps and a rollout is 16 steps per env, so nearly every checkpoint
falls inside running episodes: the resumed run must replay them (see rlinf_cli/runtime/vector.py).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path

import pytest

from tests.conftest import RLINF, wait_for_checkpoint

pytestmark = pytest.mark.numerics  # results depend on CPU features: make test-portable runs them again

ITERS = 60
ARGS = ["algo.rollout_steps=16", "num_envs=2", "seed=1", "progress=false", "eval.episodes=2", "algo.epochs=2",
        "algo.minibatch_size=16", f"total_steps={16 * 2 * ITERS}"]


def _env(mkl_cbwr: str | None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "MKL_CBWR"}
    if mkl_cbwr is not None:
        env["MKL_CBWR"] = mkl_cbwr
    return env


def _run(args: list[str], env: dict[str, str]) -> None:
    res = subprocess.run([RLINF, "rl", *args], capture_output=True, text=True, timeout=600, env=env)
    assert res.returncode == 0, res.stderr[-3000:]


def _metrics(run_dir: Path) -> list[dict]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    timing = lambda k: k.startswith("time/") or k.endswith("_s")  # noqa: E731  (wall-clock seconds)
    return [{k: v for k, v in r.items() if not timing(k)} for r in rows]


def _kill_after(args: list[str], env: dict[str, str], marker: Path) -> None:
    proc = subprocess.Popen([RLINF, "rl", *args], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)
    wait_for_checkpoint(marker.parent.parent, int(marker.name.split("_")[1]), proc)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=60)
    proc.stderr.close()


def _latest_checkpoint(run_dir: Path) -> Path:
    return sorted(p for p in (run_dir / "checkpoints").iterdir() if p.name.startswith("iter_"))[-1]


@pytest.mark.parametrize("mode,mkl_cbwr", [
    ("collocated", None),  # rlinf sets MKL's reproducible mode itself
    ("collocated", "COMPATIBLE"),  # a user's own MKL_CBWR is kept, and resume is exact too
    ("disaggregated", None),  # envs in worker processes: replayed there
])
def test_checkpoint_interval_changes_nothing_and_a_killed_run_resumes_exactly(workdir, mode, mkl_cbwr):
    env = _env(mkl_cbwr)
    common = [*ARGS, f"runtime.mode={mode}", "runtime.env_workers=2", "tracking.enabled=false"]
    _run([*common, "checkpoint.interval=1", "checkpoint.keep=200", "run_dir=every"], env)
    _run([*common, "checkpoint.interval=1000000", "run_dir=never"], env)
    every, never = _metrics(workdir / "every"), _metrics(workdir / "never")
    # the starting policy's validation (eval.best), one row per iteration, then the final eval
    assert len(every) == ITERS + 2 and "val/return_mean" in every[0] and "val/return_mean" in every[-2]
    assert every == never  # returns, losses, lr, episode lengths: iteration by iteration
    # episodes longer than a checkpoint interval (16 steps) exist: checkpoints did not cut them
    assert max(r.get("rollout/length_mean", 0) for r in every) > 16

    # killed mid-run with SIGKILL, then resumed from its newest checkpoint (in its own directory)
    _kill_after([*common, "checkpoint.interval=3", "run_dir=killed"], env, workdir / "killed/checkpoints/iter_000009")
    last = _latest_checkpoint(workdir / "killed")
    assert int(last.name.split("_")[1]) < ITERS
    _run([f"resume={last}"], env)
    assert _metrics(workdir / "killed") == every


def test_a_simulator_that_cannot_replay_resumes_with_fresh_episodes(workdir):
    """The documented rule for EnvSpec(replayable=False): the resumed run says so and starts new
    episodes; the uninterrupted run is unaffected by its checkpoints either way."""
    from tests.plugin_fixtures import plugin_env

    env = plugin_env(workdir / "site")
    args = ["sim=counter_norep", "num_envs=2", "algo.rollout_steps=8", "total_steps=256", "checkpoint.interval=2",
            "tracking.enabled=false", "progress=false", "eval.episodes=0", "checkpoint.keep=100"]
    _run([*args, "run_dir=a"], env)
    res = subprocess.run([RLINF, "rl", f"resume={workdir / 'a/checkpoints/iter_000006'}", "run_dir=b"],
                         capture_output=True, text=True, timeout=300, env=env)
    assert res.returncode == 0, res.stderr
    assert "cannot be replayed" in res.stderr and "starts fresh episodes" in res.stderr
    resumed, full = _metrics(workdir / "b"), _metrics(workdir / "a")
    assert len(resumed) == len(full) - 7  # the start's validation (eval.best) and 6 iterations
    # the counter's episode length shows the fresh start: 30-step episodes end later than in the full run
    assert [r.get("rollout/episodes") for r in resumed] != [r.get("rollout/episodes") for r in full[7:]]


def test_runner_restore_replays_running_episodes_into_the_same_state():
    """Runner.state() after some rollouts, restored into fresh envs, gives the same next rollout."""
    import numpy as np
    import torch

    from fake_sims import CounterSim
    from rlinf_cli.api import ArraySpec, EnvSpec
    from rlinf_cli.registry import get_registry
    from rlinf_cli.runtime.rollout import Runner
    from rlinf_cli.runtime.vector import SyncVecEnv

    sim = CounterSim(horizon=11)
    spec = sim.spec
    model = get_registry().load("model", "mlp")({"name": "mlp", "hidden_sizes": [8]}, spec)
    torch.manual_seed(0)
    a = Runner(SyncVecEnv(sim, range(3)), model)
    a.reset([5, 6, 7])
    for _ in range(3):
        a.collect_steps(7)  # 21 steps per env with episodes of 11: two cut mid-episode
    state = a.state()
    assert (state["action_lengths"] > 0).all() and (state["episodes"] == 1).all()
    rng = torch.get_rng_state()
    nxt = a.collect_steps(7)
    b = Runner(SyncVecEnv(sim, range(3)), model)
    b.restore(state)
    torch.set_rng_state(rng)
    again = b.collect_steps(7)
    for k in nxt.obs:
        torch.testing.assert_close(nxt.obs[k], again.obs[k], rtol=0, atol=0)
    torch.testing.assert_close(nxt.rewards, again.rewards, rtol=0, atol=0)
    assert [e.length for e in nxt.episodes] == [e.length for e in again.episodes]
    np.testing.assert_array_equal(a.state()["episodes"], b.state()["episodes"])
    assert isinstance(spec, EnvSpec) and ArraySpec


def test_a_resumed_run_keeps_the_kl_reference_it_started_from(workdir):
    """algo.kl_coef penalises drift from the init= policy; a resumed run must measure the drift
    from that same policy (not from the weights it resumed), so its metrics, kl_ref included,
    are the uninterrupted run's."""
    env = _env(None)
    _run([*ARGS[:-1], "total_steps=128", "eval.episodes=0", "tracking.enabled=false", "run_dir=start"], env)
    iters = 8
    args = [*ARGS[:-1], f"total_steps={16 * 2 * iters}", "eval.episodes=0", "tracking.enabled=false",
            f"init={workdir / 'start/checkpoints/final'}", "algo.kl_coef=0.5", "algo.critic_warmup_iters=1",
            "algo.anneal_lr=false", "checkpoint.interval=1", "checkpoint.keep=100"]
    _run([*args, "run_dir=full"], env)
    _run([f"resume={workdir / 'full/checkpoints/iter_000004'}", "run_dir=resumed"], env)
    full, resumed = _metrics(workdir / "full"), _metrics(workdir / "resumed")
    assert len(full) >= iters and resumed == full[5:]  # full[0]: the start's validation (eval.best)
    assert resumed[0]["train/kl_ref"] > 1e-6  # the policy had drifted by then: the reference is the start


def test_a_resumed_run_draws_the_demonstrations_the_uninterrupted_one_draws(workdir):
    """algo.bc_coef imitates demonstrations beside every minibatch, drawn from the run's own
    generator: a resumed run draws the same steps, so its metrics (demo_loss included) are the
    uninterrupted run's."""
    env = _env(None)
    res = subprocess.run([RLINF, "collect", "policy=expert", "episodes=2", "num_envs=2", "output=demos", "progress=false",
                          "tracking.enabled=false", "run_dir=c"], capture_output=True, text=True, timeout=600, env=env)
    assert res.returncode == 0, res.stderr[-3000:]
    iters = 8
    args = [*ARGS[:-1], f"total_steps={16 * 2 * iters}", "eval.episodes=0", "tracking.enabled=false",
            f"demos={workdir / 'demos'}", "algo.bc_coef=0.5", "algo.bc_loss=nll", "algo.anneal_lr=false",
            "checkpoint.interval=1", "checkpoint.keep=100"]
    _run([*args, "run_dir=full"], env)
    _run([f"resume={workdir / 'full/checkpoints/iter_000004'}", "run_dir=resumed"], env)
    full, resumed = _metrics(workdir / "full"), _metrics(workdir / "resumed")
    assert len(full) >= iters and resumed == full[5:]  # full[0]: the start's validation (eval.best)
    demo = [r["train/demo_loss"] for r in resumed if "train/policy_loss" in r]  # not the final validation's row
    assert len(demo) == iters - 4 and all(v > 0 for v in demo), resumed
