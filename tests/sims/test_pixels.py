"""Pixel observations of gymnasium's MuJoCo envs, rendered offscreen on the CPU, and how they travel."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from rlinf_cli.errors import UserError


def _sim(**kw):
    from rlinf_cli.registry import make_simulator

    return make_simulator({"name": "gymnasium", **kw})


def test_rgb_and_state_rgb_specs_and_frames() -> None:
    from rlinf_cli.runtime.vector import SyncVecEnv

    sim = _sim(env_id="InvertedPendulum-v5", obs="state_rgb", image_size=32)
    assert sim.spec.observation["rgb"].shape == (32, 32, 3) and sim.spec.observation["rgb"].dtype == "uint8"
    assert sim.spec.observation["state"].shape == (4,)
    env = SyncVecEnv(sim, range(2))
    try:
        obs = env.reset([0, 1])
        assert obs["rgb"].shape == (2, 32, 32, 3) and obs["rgb"].dtype == np.uint8
        assert obs["rgb"].std() > 5  # a rendered scene, not a blank buffer
        frames = [env.step(np.full((2, 1), 3.0, dtype=np.float32)).obs["rgb"] for _ in range(15)]
        assert np.abs(frames[-1].astype(int) - obs["rgb"].astype(int)).sum() > 0  # the pole moved on screen
    finally:
        env.close()
    only = _sim(env_id="InvertedPendulum-v5", obs="rgb", image_size=32)
    assert list(only.spec.observation) == ["rgb"]


def test_rgb_needs_a_mujoco_env() -> None:
    with pytest.raises(UserError, match="sim.obs=rgb needs a MuJoCo env; 'CartPole-v1' is not one"):
        _sim(env_id="CartPole-v1", obs="rgb")
    with pytest.raises(UserError, match="obs must be state, rgb or state_rgb"):
        _sim(env_id="CartPole-v1", obs="depth")


def test_lz4_with_xor_delta_cuts_pixel_bytes_fourfold() -> None:
    from rlinf_executor_local.executor import LocalExecutor

    sim = _sim(env_id="HalfCheetah-v5", obs="rgb")
    rng = np.random.default_rng(0)
    sent = {}
    for delta in (False, True):
        runtime = {"mode": "disaggregated", "env_workers": 2, "obs_compression": "lz4", "obs_delta": delta}
        env = LocalExecutor({"name": "local", "runtime": runtime}).make_vec_env(sim, 4, True)
        try:
            env.reset([0, 1, 2, 3])
            raw = moved = 0.0
            for _ in range(10):
                sb = env.step(rng.uniform(-1, 1, size=(4, 6)).astype(np.float32))
                raw += sb.stats["transport/obs_bytes_raw"]
                moved += sb.stats["transport/obs_bytes"]
            sent[delta] = moved
        finally:
            env.close()
    assert raw == 10 * 4 * 84 * 84 * 3
    assert raw / sent[True] >= 4, raw / sent[True]
    assert sent[True] < sent[False]  # the delta is what buys the margin on a textured floor


def test_rl_on_pixels_in_hybrid_mode(cli) -> None:
    r = cli("rl", "sim.env_id=InvertedPendulum-v5", "sim.obs=rgb", "sim.image_size=48", "model.obs_keys=[rgb]",
            "total_steps=256", "num_envs=4", "algo.rollout_steps=32", "algo.epochs=1", "eval.episodes=1",
            "progress=false", "tracking.enabled=false", "runtime.mode=hybrid", "env.obs_compression=lz4",
            "env.obs_delta=true", "run_dir=px")
    assert r.code == 0, r.err
    m = [json.loads(x) for x in Path("px/metrics.jsonl").read_text().splitlines()][1]  # [0]: the start's validation
    assert m["rollout/transport/obs_bytes_raw_per_step"] == 4 * 48 * 48 * 3
    assert m["rollout/transport/obs_bytes_per_step"] < m["rollout/transport/obs_bytes_raw_per_step"] / 4
    assert "hybrid: 4 envs in" in r.err


def test_renders_after_mujoco_was_imported_without_a_gl_choice() -> None:
    # A test worker or pipeline that ran a state env first has mujoco imported with GLFW, which
    # needs a display; the pixel env must still render (CI failed exactly this way once).
    import os
    import subprocess
    import sys

    code = (
        "import mujoco\n"
        "from rlinf_cli.registry import make_simulator\n"
        "from rlinf_cli.runtime.vector import SyncVecEnv\n"
        "sim = make_simulator({'name': 'gymnasium', 'env_id': 'InvertedPendulum-v5', 'obs': 'rgb', 'image_size': 24})\n"
        "env = SyncVecEnv(sim, range(1))\n"
        "rgb = env.reset([0])['rgb']\n"
        "env.close()\n"
        "print(rgb.shape, int(rgb.max()))\n"
    )
    env = {k: v for k, v in os.environ.items() if k not in ("MUJOCO_GL", "PYOPENGL_PLATFORM", "DISPLAY")}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    shape, peak = out.stdout.split(")")
    assert shape.strip() == "(1, 24, 24, 3" and int(peak) > 0


def test_a_pixel_policy_cloned_from_state_rgb_runs_on_rgb_alone() -> None:
    # Experts read the state, so pixel demos are collected as state_rgb; the policy reads only the
    # image, and must then run where the simulator gives no state. A state policy must not.
    from rlinf_cli.policy import check_compatible
    from rlinf_model_mlp.model import MLPPolicy

    both = _sim(env_id="InvertedPendulum-v5", obs="state_rgb", image_size=32).spec
    rgb_only = _sim(env_id="InvertedPendulum-v5", obs="rgb", image_size=32).spec
    pixel_policy = MLPPolicy({"name": "mlp", "obs_keys": ["rgb"], "hidden_sizes": [8]}, both)
    assert pixel_policy.observation_keys == ("rgb",)
    check_compatible(pixel_policy, rgb_only, "checkpoint 'px'")
    state_policy = MLPPolicy({"name": "mlp", "obs_keys": ["state"], "hidden_sizes": [8]}, both)
    with pytest.raises(UserError, match="expects observation 'state'"):
        check_compatible(state_policy, rgb_only, "checkpoint 'st'")
