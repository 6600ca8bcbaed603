"""Isaac Lab 3 (rlinf-sim-isaaclab) in its own Python 3.12 environment, served to .venv.

Marker `isaaclab`: these need `make isaaclab` (.venv-isaaclab: isaaclab 3.0.0, the plugin, the
local asset root) and run with `make test-isaaclab`; `make test` leaves them out, and without
.venv-isaaclab they skip. The first Isaac Lab env built on a machine compiles warp kernels for
about a minute and a half (cached in ~/.cache/warp afterwards).
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import time
from pathlib import Path

import pytest
from envserver import env_server

REPO = Path(__file__).resolve().parents[2]
IL_VENV = REPO / ".venv-isaaclab"
IL_RLINF = IL_VENV / "bin" / "rlinf"
ASSETS = IL_VENV / "isaac-assets"

pytestmark = [pytest.mark.isaaclab,
              pytest.mark.skipif(not IL_RLINF.exists(), reason="needs .venv-isaaclab: run `make isaaclab`")]


@contextlib.contextmanager
def isaaclab_server(task: str, *overrides: str):
    """`rlinf env serve sim=isaaclab ...` from .venv-isaaclab; yields its address."""
    with env_server([IL_RLINF], "sim=isaaclab", f"sim.task={task}", f"sim.asset_root={ASSETS}", *overrides,
                    timeout=300) as (_, address):
        yield address


def test_fake_matches_the_real_env() -> None:
    """tests/fake_isaaclab.py (what the unit tests run on) has the real env's API shape: the same
    observation groups, tensor dtypes, shapes and devices out of reset and step, extras with
    final_obs, time-outs at max_episode_length, and finished envs reset inside the step."""
    res = subprocess.run([str(IL_VENV / "bin" / "python"), str(REPO / "tests" / "isaaclab_signature.py"),
                          "Isaac-Cartpole-Direct", "4", "12"], capture_output=True, text=True, timeout=900,
                         env={**os.environ, "ISAACSIM_ASSET_ROOT": str(ASSETS), "PYTHONPATH": str(REPO / "tests")})
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    sig = json.loads(res.stdout.strip().splitlines()[-1])
    real, fake = sig["real"], sig["fake"]
    assert real["observation_groups"] == fake["observation_groups"] == ["policy"]
    assert real["action_shape"] == fake["action_shape"] == [1]
    assert real["reset"] == fake["reset"], (real["reset"], fake["reset"])
    assert real["step"] == fake["step"], (real["step"], fake["step"])
    assert real["step"][1] == {"tensor": "torch.float32", "shape": [4], "device": "cpu"}
    assert real["step"][2]["tensor"] == real["step"][3]["tensor"] == "torch.bool"
    assert real["max_episode_length"] == fake["max_episode_length"] == 12
    assert real["first_end"] == fake["first_end"], (real["first_end"], fake["first_end"])
    assert real["first_end"]["kind"] == "time_out" and real["first_end"]["step"] == 12
    assert real["first_end"]["final_obs"] == real["reset"][0]  # final_obs: the same groups as obs
    assert real["first_end"]["length_after_reset"] == 0  # reset inside the step


@pytest.mark.parametrize("task", ["Isaac-Cartpole-Direct-v0", "Isaac-Ant-Direct-v0"])
def test_check_sim_and_ppo_iterations_through_the_wire(task: str, cli, tmp_path: Path) -> None:
    import numpy as np

    from rlinf_executor_local.executor import LocalExecutor
    from rlinf_sim_remote.sim import RemoteSimulator

    with isaaclab_server(task) as address:
        res = cli("check-sim", "sim=remote", f"sim.address={address}")
        assert res.code == 0, res.err + res.out[-3000:]
        assert "FAIL" not in res.out and res.out.count("│ pass") + res.out.count("| pass") == 9, res.out
        sim = RemoteSimulator({"address": address})
        assert sim.batched and not sim.spec.per_env_seeds and not sim.spec.replayable
        env = LocalExecutor({"name": "local", "runtime": {"mode": "hybrid", "obs_compression": "lz4"}}).make_vec_env(
            sim, 8, True)
        try:
            assert len(env.shards) == 1 and len(env.handles) == 1  # one session holds the batch
            calls = []
            submit = env.handles[0].submit
            env.handles[0].submit = lambda *a: calls.append(a[0]) or submit(*a)
            env.reset(list(range(8)))
            sb = env.step(np.zeros((8, *env.spec.action.shape), np.float32))
            assert calls == ["restore", "step"]  # reset() is a restore from episode 0; one request per batched step
            assert sb.obs["state"].shape == (8, *sim.spec.observation["state"].shape)
            assert sb.stats.get("transport/obs_bytes", 0) > 0
        finally:
            env.close()
        run = tmp_path / "run"
        res = cli("rl", "--algo", "ppo", "sim=remote", f"sim.address={address}", "num_envs=16",
                  "algo.rollout_steps=16", "algo.epochs=2", "total_steps=768", "eval.episodes=0",
                  "tracking.enabled=false", f"run_dir={run}")
        assert res.code == 0, res.err[-3000:]
        rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
        iters = [r for r in rows if "train/policy_loss" in r]
        assert len(iters) == 3 and all(np.isfinite(r["train/policy_loss"]) for r in iters), rows
        assert iters[-1]["step"] == 768


def test_missing_assets_fail_fast_with_one_line(tmp_path: Path) -> None:
    empty = tmp_path / "assets"
    empty.mkdir()
    t0 = time.monotonic()
    res = subprocess.run([str(IL_RLINF), "check-sim", "sim=isaaclab", "sim.task=Isaac-Ant-Direct",
                          f"sim.asset_root={empty}"], capture_output=True, text=True, timeout=300)
    took = time.monotonic() - t0
    assert res.returncode == 2, res.stdout[-2000:] + res.stderr[-2000:]
    err = [line for line in res.stderr.splitlines() if "asset missing" in line]
    assert len(err) == 1 and "ant_instanceable.usd" in err[0] and "make isaaclab" in err[0], res.stderr[-2000:]
    assert "Traceback" not in res.stderr
    assert took < 40, f"{took:.0f} s: the asset check should come before Isaac Lab's retries"
