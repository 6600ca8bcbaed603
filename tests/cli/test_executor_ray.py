"""The Ray executor: registered without importing Ray; learns exactly like the local executor."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest


def test_ray_plugin_registers_without_importing_ray() -> None:
    code = ("import sys; from rlinf_cli.registry import get_registry; "
            "spec = get_registry().get('executor', 'ray'); "
            "assert spec.package == 'rlinf-executor-ray', spec; "
            "assert 'ray' not in sys.modules and 'torch' not in sys.modules, 'imported too much'")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr


def _final(run_dir: str) -> tuple[float, dict]:
    from safetensors.torch import load_file

    result = json.loads((Path(run_dir) / "result.json").read_text())
    return result["eval"]["return_mean"], load_file(str(Path(run_dir) / "checkpoints" / "final" / "model.safetensors"))


@pytest.mark.slow
@pytest.mark.learning
def test_ray_learns_cartpole_like_the_local_executor(cli, learning) -> None:
    """The very same run as the local executor: synchronous actors step the same envs with the
    same seeds and actions, so every metric row and the final weights are equal, and it learns
    (return 4x its first rollouts'). 24k steps, not the local bar's 100k
    (tests/learning/test_learning_cartpole.py): under load a Ray step costs several times an in-process
    one, and equality row by row carries the local executor's bar over."""
    import torch

    common = ["total_steps=24000", "eval.episodes=10", "progress=false", "tracking.enabled=false", f"seed={learning.seed}"]
    r = cli("rl", *common, "run_dir=local")
    assert r.code == 0, r.err
    r = cli("rl", *common, "executor=ray", "run_dir=ray")
    assert r.code == 0, r.err
    assert "runtime: ray (local Ray instance), disaggregated: 8 envs in" in r.err

    def rows(run: str) -> list[dict]:
        skip = ("time/", "perf/", "sys/")  # wall-clock columns differ between any two runs
        return [{k: v for k, v in json.loads(line).items() if not k.startswith(skip)}
                for line in (Path(run) / "metrics.jsonl").read_text().splitlines()]

    local_rows, ray_rows = rows("local"), rows("ray")  # Ray's rows add transport columns
    assert len(ray_rows) == len(local_rows) >= 90
    assert [{k: row[k] for k in want} for row, want in zip(ray_rows, local_rows)] == local_rows
    first = next(r["rollout/return_mean"] for r in ray_rows if "rollout/return_mean" in r)
    (local_ret, local_w), (ray_ret, ray_w) = _final("local"), _final("ray")
    # final/first measured 5.7-32 over seeds 0-4 and 4 lesser-CPU draws (docs/benchmarks.md)
    learning.record(ray_ret / first, 4, first=first, final=ray_ret)
    assert ray_ret > 4 * first, (first, ray_ret)  # it learned
    assert ray_ret == local_ret
    for k in local_w:
        assert torch.equal(local_w[k], ray_w[k]), k


@pytest.mark.slow
def test_ray_actor_death_is_recovered(capsys) -> None:
    import ray
    from ray import cloudpickle

    import fake_sims
    from rlinf_executor_ray.executor import RayExecutor

    cloudpickle.register_pickle_by_value(fake_sims)  # actors do not have tests/ on their path
    env = RayExecutor({"name": "ray", "runtime": {"mode": "hybrid", "env_workers": 2, "max_restarts": 1}}) \
        .make_vec_env(fake_sims.CounterSim(horizon=50), 4, True)
    try:
        env.reset([0, 1, 2, 3])
        env.step(np.ones(4, dtype=np.int64))
        dead = env.handles[0].actor
        ray.kill(dead)
        # ray.kill returns before the actor is gone: a call sent at once can still run on it (seen
        # under load), so wait until the handle fails, as the executor's next call then will
        deadline = time.time() + 60
        while True:
            try:
                ray.get(dead.ping.remote(), timeout=10)
            except ray.exceptions.RayActorError:
                break
            assert time.time() < deadline, "the killed actor still answers after 60 s"
            time.sleep(0.1)
        sb = env.step(np.ones(4, dtype=np.int64))
        assert "env worker 0 (envs 0-1) died during step" in capsys.readouterr().err
        assert sb.truncated.tolist() == [True, True, False, False]
        sb = env.step(np.ones(4, dtype=np.int64))
        assert sb.obs["state"][:, 2].tolist() == [1.0, 1.0, 3.0, 3.0]
    finally:
        env.close()


@pytest.mark.slow
@pytest.mark.parametrize("sync", ["auto", "broadcast"])
def test_ray_generation_workers_equal_sampling_in_the_trainer_through_a_kill(workdir, sync) -> None:
    """placement.generation.workers=2 executor=ray: the workers are actors, the policy's files go
    through the object store, each weight version too (sync=auto) or by a gloo broadcast from the
    driver (sync=broadcast); an actor killed with -9 mid-run is replaced, sent the current weights
    (broadcast: in a group formed again) and its request again, and the synchronous run still equals
    the in-process one."""
    import os
    import signal

    import psutil

    from generation_runs import GRPO, RLINF, assert_same_run, column, splits

    grpo = [*GRPO, "text.iterations=5"]
    ref = subprocess.run([RLINF, "rl", *grpo, "run_dir=ref"], cwd=workdir, capture_output=True, text=True, timeout=600)
    assert ref.returncode == 0, ref.stderr[-3000:]
    proc = subprocess.Popen([RLINF, "rl", *grpo, "executor=ray", "placement.generation.workers=2", "run_dir=ray",
                             f"placement.generation.sync={sync}"],
                            cwd=workdir, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        metrics, deadline = workdir / "ray" / "metrics.jsonl", time.time() + 600
        while not (metrics.is_file() and '"iteration": 1.0' in metrics.read_text()):
            assert proc.poll() is None and time.time() < deadline, proc.communicate()[1][-3000:]
            time.sleep(0.1)
        # this run's actors (its local Ray cluster is its child), not another Ray test's beside it under xdist
        def cmdline(p: psutil.Process) -> str:
            try:
                return " ".join(p.cmdline())
            except psutil.Error:  # a short-lived helper that ended while we looked
                return ""

        actors = [p for p in psutil.Process(proc.pid).children(recursive=True) if "RayGenerationWorker" in cmdline(p)]
        assert len(actors) == 2, actors
        os.kill(actors[0].pid, signal.SIGKILL)
        out, err = proc.communicate(timeout=900)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err[-3000:]
    assert "sampling: 2 generation worker(s), executor=ray" in err
    assert ("weights by gloo broadcast" in err) == (sync == "broadcast"), err[-3000:]
    assert sum(l.startswith("warning: generation worker") for l in err.splitlines()) == 1, err[-3000:]  # noqa: E741
    assert sum(column(workdir / "ray", "rollout/runtime/generation_restarts")) == 1.0
    # split wherever that is exact: batches with prompts of several lengths (iteration 5's have one)
    assert column(workdir / "ray", "rollout/runtime/generation_parts") == ([2.0, 2.0, 2.0, 2.0, 1.0] if splits(err) else [1.0] * 5)
    assert_same_run(workdir / "ref", workdir / "ray")
