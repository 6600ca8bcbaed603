"""ManiSkill3 (rlinf-sim-maniskill) in its own environment, served to .venv through the env server.

Marker `maniskill`: these need `make maniskill` (.venv-maniskill: mani-skill 3.0.1, numpy<2, a
Vulkan driver) and run with `make test-maniskill`; `make test` leaves them out, and without
.venv-maniskill they skip.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
from pathlib import Path

import numpy as np
import pytest
from envserver import env_server

REPO = Path(__file__).resolve().parents[2]
MS_RLINF = REPO / ".venv-maniskill" / "bin" / "rlinf"

pytestmark = [pytest.mark.maniskill,
              pytest.mark.skipif(not MS_RLINF.exists(), reason="needs .venv-maniskill: run `make maniskill`")]


@contextlib.contextmanager
def maniskill_server(*overrides: str):
    """`rlinf env serve sim=maniskill ...` from .venv-maniskill; yields its address."""
    with env_server([MS_RLINF], "sim=maniskill", *overrides, timeout=180) as (_, address):
        yield address


def test_tasks_pass_the_contract_in_their_own_environment() -> None:
    """Same-venv use (no conflicts): `rlinf check-sim sim=maniskill` inside .venv-maniskill."""
    for task in ("PushCube-v1", "PickCube-v1", "StackCube-v1", "PegInsertionSide-v1"):
        res = subprocess.run([str(MS_RLINF), "check-sim", "sim=maniskill", f"sim.task={task}"], capture_output=True,
                             text=True, timeout=600, env={**os.environ, "COLUMNS": "200"})
        assert res.returncode == 0, (task, res.stdout[-2000:], res.stderr[-2000:])
        assert "FAIL" not in res.stdout


def test_check_sim_and_seeded_resets_through_the_wire(cli) -> None:
    from rlinf_executor_local.executor import LocalExecutor
    from rlinf_sim_remote.sim import RemoteSimulator

    with maniskill_server("sim.task=PickCube-v1") as address:
        res = cli("check-sim", "sim=remote", f"sim.address={address}")
        assert res.code == 0, res.err
        assert "FAIL" not in res.out and res.out.count("| pass") + res.out.count("│ pass") == 8
        sim = RemoteSimulator({"address": address})
        assert sim.spec.observation["state"].shape == (42,) and sim.spec.action.shape == (4,) and sim.spec.has_success
        env = LocalExecutor({"name": "local", "runtime": {"mode": "hybrid"}}).make_vec_env(sim, 4, True)
        try:
            a = env.reset([7, 7, 8, 8])  # GRPO groups: one seed, one initial state
            np.testing.assert_array_equal(a["state"][0], a["state"][1])
            np.testing.assert_array_equal(a["state"][2], a["state"][3])
            assert not np.array_equal(a["state"][0], a["state"][2])
            b = env.reset([8, 8, 7, 7])
            np.testing.assert_array_equal(a["state"][0], b["state"][2])
            sb = env.step(np.zeros((4, 4), np.float32))
            assert sb.reward.shape == (4,) and (sb.reward >= 0).all() and (sb.reward <= 1).all()
        finally:
            env.close()


@pytest.mark.parametrize("task", ["PushCube-v1", "PickCube-v1", "StackCube-v1"])
def test_scripted_experts_through_the_wire(cli, task) -> None:
    with maniskill_server(f"sim.task={task}") as address:
        res = cli("eval", "sim=remote", f"sim.address={address}", "checkpoint=expert", "episodes=8", "num_envs=4",
                  "tracking.enabled=false")
    assert res.code == 0, res.err
    assert res.json_tail()["success_once"] >= 0.75


def test_pixels_with_lz4_through_the_wire() -> None:
    from rlinf_executor_local.executor import LocalExecutor
    from rlinf_sim_remote.sim import RemoteSimulator

    with maniskill_server("sim.obs=rgb", "sim.image_size=48") as address:
        sim = RemoteSimulator({"address": address})
        assert sim.spec.observation["rgb"].shape == (48, 48, 3) and "state" not in sim.spec.observation
        env = LocalExecutor({"name": "local", "runtime": {"mode": "disaggregated", "obs_compression": "lz4",
                                                           "obs_delta": True}}).make_vec_env(sim, 2, True)
        try:
            obs = env.reset([1, 2])
            assert obs["rgb"].dtype == np.uint8 and obs["rgb"].std() > 5  # a rendered scene, not a blank frame
            assert obs["proprio"].shape == (2, sim.spec.observation["proprio"].shape[0])
            sb = env.step(np.zeros((2, 4), np.float32))
            assert 0 < sb.stats["transport/obs_bytes"] < sb.stats["transport/obs_bytes_raw"]
        finally:
            env.close()


@pytest.mark.slow
def test_cloned_expert_and_ppo_through_the_wire(cli, workdir) -> None:
    """collect (expert) -> sft -> eval on PushCube through the server: a cloned policy far above random;
    and `rlinf rl --algo ppo sim=remote` runs end to end (the long learning run is in docs/remote.md)."""
    with maniskill_server("sim.task=PushCube-v1") as address:
        remote = ["sim=remote", f"sim.address={address}"]
        res = cli("collect", *remote, "policy=expert", "episodes=30", "num_envs=6", "output=demos", "tracking.enabled=false")
        assert res.code == 0, res.err
        res = cli("sft", "dataset=demos", "model.hidden_sizes=[256,256]", "algo.epochs=200", "run_dir=bc",
                  "tracking.enabled=false", "progress=false")
        assert res.code == 0, res.err
        res = cli("eval", *remote, "checkpoint=bc/checkpoints/best", "episodes=20", "num_envs=5", "tracking.enabled=false")
        assert res.code == 0, res.err
        cloned = res.json_tail()["success_once"]
        res = cli("eval", *remote, "checkpoint=random", "episodes=20", "num_envs=5", "tracking.enabled=false")
        random = res.json_tail()["success_once"]
        assert cloned >= 0.5 and cloned >= random + 0.4, (cloned, random)
        res = cli("rl", "--algo", "ppo", *remote, "num_envs=8", "total_steps=1600", "algo.rollout_steps=50",
                  "eval.episodes=4", "tracking.enabled=false", "progress=false", "run_dir=ppo")
        assert res.code == 0, res.err
    rows = [json.loads(line) for line in (workdir / "ppo" / "metrics.jsonl").read_text().splitlines()]
    assert rows and rows[-1]["step"] >= 1600
