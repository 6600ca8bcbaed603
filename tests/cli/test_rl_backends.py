"""Embodied RL on the training engines: DeepSpeed ZeRO in one process, and torchrun ranks.

The engines themselves live in ``rlinf_cli.runtime.engine`` (shared by every stage); these
tests check the embodied `rlinf rl` path drives them: learning, checkpoints, rank bookkeeping.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.numerics  # results depend on CPU features: make test-portable runs them again


ARGS = ["num_envs=4", "eval.episodes=3", "progress=false", "tracking.enabled=false", "algo.epochs=4",
        "algo.rollout_steps=128"]


def _metrics(run_dir: str) -> list[dict]:
    return [json.loads(x) for x in (Path(run_dir) / "metrics.jsonl").read_text().splitlines()]


# DeepSpeed keeps process-wide state after a run: each DeepSpeed run gets its own process.
@pytest.mark.slow
def test_lean_update_matches_the_engine_update_in_one_process(cli_proc) -> None:
    """Same run on the lean torch path and on a DeepSpeed ZeRO-0 engine: same learning, to float noise."""
    for backend in ("torch", "deepspeed"):
        r = cli_proc("rl", *ARGS, "total_steps=1024", f"train.backend={backend}", "train.zero_stage=0", f"run_dir={backend}")
        assert r.code == 0, r.err
    a, b = _metrics("torch"), _metrics("deepspeed")
    for x, y in zip(a[1:3], b[1:3]):  # a[0]: the start's validation (eval.best)
        assert x["rollout/return_mean"] == pytest.approx(y["rollout/return_mean"])
        assert x["train/policy_loss"] == pytest.approx(y["train/policy_loss"], abs=1e-4)
        assert x["train/value_loss"] == pytest.approx(y["train/value_loss"], rel=1e-3)


@pytest.mark.parametrize("stage", [2, pytest.param(3, marks=pytest.mark.slow)])
def test_deepspeed_zero_trains_and_saves_a_loadable_checkpoint(cli_proc, stage: int) -> None:
    from rlinf_cli.policy import load_policy

    r = cli_proc("rl", *ARGS, "total_steps=2048", "train.backend=deepspeed", f"train.zero_stage={stage}", "run_dir=ds")
    assert r.code == 0, r.err
    m = _metrics("ds")
    assert m[1]["train/grad_norm"] > 0 and len([x for x in m if "train/policy_loss" in x]) == 4  # m[0]: validation
    policy = load_policy("ds/checkpoints/final")
    assert sum(p.numel() for p in policy.parameters()) > 0


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["torch", "deepspeed"])
@pytest.mark.learning
def test_torchrun_two_ranks_share_the_work(workdir, backend: str, learning) -> None:
    """Two ranks, each stepping its own 8 CartPole envs with the task's recommended PPO settings
    (32 steps an env an iteration), gradients averaged: the policy learned. Learned means 4x the
    first rollouts' return, not solved: two ranks average their gradients, so 40,960 steps are
    half a single process's gradient steps, and solving takes a budget this test can't spend.
    Measured final/first: torch 5.8-32.1, deepspeed 11.3-32.1 over seeds 0-4 and 4 lesser-CPU
    draws (docs/benchmarks.md, "Learning-test margins")."""
    rlinf = str(Path(sys.executable).with_name("rlinf"))
    torchrun = str(Path(sys.executable).with_name("torchrun"))
    cmd = [torchrun, "--nproc_per_node=2", f"--master_port={_port()}", rlinf, "rl", "progress=false",
           "tracking.enabled=false", "total_steps=40960", "num_envs=8", f"train.backend={backend}", "run_dir=tr",
           "eval.episodes=10", f"seed={learning.seed}"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    m = _metrics("tr")
    steps = [x["env_steps"] for x in m if "train/policy_loss" in x]
    assert steps[:2] == [512.0, 1024.0]  # 2 ranks x 8 envs x 32 steps per iteration
    result = json.loads(Path("tr/result.json").read_text())
    first = next(x["rollout/return_mean"] for x in m if "rollout/return_mean" in x)
    final = result["eval"]["return_mean"]
    learning.record(final / first, 4, first=first, final=final)
    assert result["env_steps"] >= 40960 and final >= 4 * first, (first, final)  # CartPole learned
    assert not list(Path(".").glob("rlinf_runs")), "rank 1 wrote a run directory"


@pytest.mark.slow
def test_deepspeed_runs_resume_exactly(cli_proc, workdir) -> None:
    """ZeRO's optimizer state is saved with each checkpoint (DeepSpeed's own shards) and restored."""
    args = ["total_steps=4096", "num_envs=4", "algo.rollout_steps=128", "eval.episodes=2", "progress=false",
            "tracking.enabled=false", "train.backend=deepspeed", "train.zero_stage=2", "checkpoint.interval=1",
            "checkpoint.keep=10"]
    r = cli_proc("rl", *args, "run_dir=a")
    assert r.code == 0, r.err
    assert (workdir / "a/checkpoints/iter_000002/deepspeed/state").is_dir()
    r = cli_proc("rl", f"resume={workdir / 'a/checkpoints/iter_000002'}", "run_dir=b")
    assert r.code == 0, r.err
    timing = lambda k: k.startswith("time/") or k.endswith("_s")  # noqa: E731
    rows = [[{k: v for k, v in row.items() if not timing(k)} for row in _metrics(d)] for d in ("a", "b")]
    assert rows[1] == rows[0][3:]  # the resumed run continues exactly (rows[0][0]: the start's validation)


@pytest.mark.slow
@pytest.mark.parametrize("algo", ["ppo", "sac"])
def test_torchrun_ranks_merge_their_normalization_statistics(workdir, algo: str) -> None:
    """Two ranks, each with its own envs: the checkpoint's observation statistics count the
    observations of both ranks (merged after every rollout), and training runs on both the
    on-policy and the off-policy path."""
    from safetensors.numpy import load_file

    rlinf = str(Path(sys.executable).with_name("rlinf"))
    torchrun = str(Path(sys.executable).with_name("torchrun"))
    extra = ["algo.rollout_steps=16"] + (["algo.warmup_steps=32", "algo.buffer_size=2000", "algo.minibatch_size=32",
                                          "model.hidden_sizes=[16,16]"] if algo == "sac" else [])
    cmd = [torchrun, "--nproc_per_node=2", f"--master_port={_port()}", rlinf, "rl", f"algo={algo}",
           "sim.env_id=Pendulum-v1", "num_envs=2", "total_steps=512", "env.normalize_obs=true",
           "env.normalize_reward=true", "eval.episodes=1", "progress=false", "tracking.enabled=false", "run_dir=tr", *extra]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(Path("tr/result.json").read_text())
    assert result["world_size"] == 2 and result["env_steps"] == 512
    stats = load_file("tr/checkpoints/final/normalizer.safetensors")
    assert stats["state.count"][0] == pytest.approx(512, abs=1e-3)  # both ranks' 256 observations each
    assert stats["__return__.count"][0] == pytest.approx(512, abs=1e-3)
