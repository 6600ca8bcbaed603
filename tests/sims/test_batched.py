"""Batched simulators (BatchedSimulator / BatchedEnv) and rlinf-sim-isaaclab's adapter, on a fake
Isaac Lab env with the real API shape (tests/fake_isaaclab.py; checked against the real env by
tests/sims/test_isaaclab.py, marker ``isaaclab``). CPU, no Isaac Lab needed."""

from __future__ import annotations

import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pytest
import torch

REPO = Path(__file__).resolve().parents[2]
PLUGIN = REPO / "plugins_sims" / "rlinf-sim-isaaclab"
# The plugin is not installed in .venv (Isaac Lab needs Python 3.12): its package is put on the
# path through a directory of its own, so that an egg-info an editable install elsewhere left in
# plugins_sims/rlinf-sim-isaaclab does not register it here (the contract tests would build it).
_SHIM = Path(tempfile.mkdtemp(prefix="rlinf-isaaclab-plugin-"))
(_SHIM / "rlinf_sim_isaaclab").symlink_to(PLUGIN / "rlinf_sim_isaaclab", target_is_directory=True)
sys.path.insert(0, str(_SHIM))

from fake_isaaclab import FakeIsaacLabEnv, FakeIsaacLabSimulator  # noqa: E402

from rlinf_cli.api import BatchedSimulator  # noqa: E402
from rlinf_cli.errors import UserError  # noqa: E402
from rlinf_cli.runtime.batched import BatchedVecEnv  # noqa: E402
from rlinf_cli.runtime.placement import runtime_config  # noqa: E402
from rlinf_cli.runtime.vector import ReplayError  # noqa: E402
from rlinf_cli.runtime.hosting import hosted_vec_env  # noqa: E402

pytestmark = pytest.mark.numerics  # results depend on CPU features: make test-portable runs them again


def _vec(sim, n: int, autoreset: bool = True) -> BatchedVecEnv:
    env = hosted_vec_env(sim, runtime_config(None), n, autoreset, "local")
    assert isinstance(env, BatchedVecEnv)
    return env


def test_plugin_registers_without_importing_torch_or_isaaclab() -> None:
    code = ("import sys; sys.path.insert(0, sys.argv[1]); import rlinf_sim_isaaclab.plugin, rlinf_sim_isaaclab.sim; "
            "bad = [m for m in ('torch', 'isaaclab', 'isaaclab_tasks', 'gymnasium') if m in sys.modules]; "
            "assert not bad, bad")
    subprocess.run([sys.executable, "-c", code, str(_SHIM)], check=True, timeout=60)


def test_fake_is_a_batched_simulator_and_check_sim_passes() -> None:
    from rlinf_cli.checks import check_simulator

    sim = FakeIsaacLabSimulator()
    assert isinstance(sim, BatchedSimulator)
    rows = check_simulator(sim)
    assert [r for r in rows if not r[1]] == [], rows
    assert rows[-1][0].startswith("a batch of 4 envs") and "per_env_seeds=False" in rows[-1][2]


def test_autoreset_reports_final_obs_flags_and_success() -> None:
    sim = FakeIsaacLabSimulator(horizon=5)
    env = _vec(sim, 4)
    assert sim.built == [4]  # one batch of the engine, not four envs
    obs = env.reset([3, 3, 3, 3])
    assert obs["state"].dtype == np.float32 and obs["state"].shape == (4, 4)
    for t in range(5):
        sb = env.step(np.zeros((4, 1), np.float32))
        assert sb.reward.dtype == np.float32 and sb.terminated.dtype == bool and sb.obs["state"].shape == (4, 4)
    # zero force: nobody falls within 5 steps, every episode times out together
    assert sb.truncated.all() and not sb.terminated.any()
    assert sb.success.all()  # success=time_out: reaching the time limit alive
    assert sb.final_obs is not None
    # the final observation is the last of the old episode; obs already starts the next one
    assert not np.allclose(sb.final_obs["state"], sb.obs["state"])
    assert np.abs(sb.obs["state"]).max() <= 0.1 + 1e-6  # fresh episodes start within the reset range
    np.testing.assert_array_equal(env._episodes, [1, 1, 1, 1])
    env.close()
    assert env.env.env.closed


def test_termination_wins_over_time_out_and_success_follows_flags() -> None:
    sim = FakeIsaacLabSimulator(horizon=200, success="terminated")
    env = _vec(sim, 8)
    env.reset([0] * 8)
    ended_term = 0
    for _ in range(200):
        sb = env.step(np.full((8, 1), -1.0, np.float32))  # pushes the pole over
        assert not (sb.terminated & sb.truncated).any()
        np.testing.assert_array_equal(sb.success, sb.terminated)
        ended_term += int(sb.terminated.sum())
    assert ended_term > 0


def test_without_autoreset_finished_envs_are_hidden_until_reset() -> None:
    from rlinf_cli.runtime.rollout import run_episodes

    sim = FakeIsaacLabSimulator(horizon=30)
    env = _vec(sim, 6, autoreset=False)
    rng = np.random.default_rng(0)
    eps = run_episodes(env, lambda o: (None, rng.uniform(-1, 1, (6, 1)).astype(np.float32)), [5] * 6)
    assert all(1 <= e.length <= 30 for e in eps)
    # the engine keeps stepping (and resetting) finished envs; their rows are frozen with zero reward
    sb = env.step(np.zeros((6, 1), np.float32))
    assert not (sb.terminated | sb.truncated).any() and not sb.reward.any()
    last = sb.obs["state"].copy()
    sb = env.step(np.ones((6, 1), np.float32))
    np.testing.assert_array_equal(sb.obs["state"], last)


def test_seeds_seed_the_batch_and_leave_the_callers_torch_stream_alone() -> None:
    sim = FakeIsaacLabSimulator()
    env = _vec(sim, 4)
    a = env.reset([11, 12, 13, 14])
    b = env.reset([11, 0, 0, 0])  # per_env_seeds=False: the batch follows the first seed
    np.testing.assert_array_equal(a["state"], b["state"])
    c = env.reset([12, 12, 13, 14])
    assert not np.array_equal(a["state"], c["state"])
    torch.manual_seed(123)
    want = torch.rand(3)
    torch.manual_seed(123)
    env.reset([99] * 4)  # Isaac Lab seeds torch's global generator: the adapter restores it
    np.testing.assert_array_equal(torch.rand(3), want)


def test_restore_refuses_to_replay_but_restarts_streams() -> None:
    env = _vec(FakeIsaacLabSimulator(), 2)
    with pytest.raises(ReplayError, match="cannot replay"):
        env.restore([1, 2], [0, 0], [np.zeros((3, 1), np.float32), np.zeros((0, 1), np.float32)])
    obs = env.restore([1, 2], [4, 4], None)
    assert obs["state"].shape == (2, 4)


def test_observation_groups_map_to_keys() -> None:
    from rlinf_sim_isaaclab.sim import flatten_obs

    pol, crit, img = torch.zeros(2, 3), torch.ones(2, 5), torch.zeros(2, 8, 8, 3)
    out = flatten_obs({"policy": pol, "critic": crit, "camera": {"rgb": img}}, "policy")
    assert set(out) == {"state", "critic", "camera_rgb"} and out["state"] is pol
    env = _vec(FakeIsaacLabSimulator(state_dim=5), 3)
    obs = env.reset([0, 0, 0])
    assert obs["critic"].shape == (3, 5) and obs["critic"].dtype == np.float32


def test_local_executor_steps_the_batch_in_process_whatever_the_mode() -> None:
    from rlinf_executor_local.executor import LocalExecutor

    for mode in ("auto", "hybrid", "disaggregated"):
        sim = FakeIsaacLabSimulator()
        ex = LocalExecutor({"name": "local", "runtime": {"mode": mode}})
        env = ex.make_vec_env(sim, 8, True)
        try:
            assert isinstance(env, BatchedVecEnv) and sim.built == [8], mode
            assert "one batch" in ex.describe()
        finally:
            env.close()


def test_truncated_episodes_bootstrap_without_a_final_obs() -> None:
    """An engine that cannot report final observations: the value before the last step stands in."""
    from rlinf_cli.runtime.rollout import Runner

    class _Policy:
        has_critic = True

        def act(self, obs, deterministic=False):
            from types import SimpleNamespace

            n = obs["state"].shape[0]
            return SimpleNamespace(action=torch.zeros(n, 1), logprob=torch.zeros(n), value=obs["state"][:, 0] + 7.0)

        def get_value(self, obs):
            return obs["state"][:, 0] + 7.0

    for final_obs in (True, False):
        env = _vec(FakeIsaacLabSimulator(horizon=4, final_obs=final_obs), 3)
        runner = Runner(env, _Policy())
        runner.reset([1, 1, 1])
        exp = runner.collect_steps(6)
        cut = exp.trunc_values[3]  # step 4 of every env timed out
        assert (exp.dones[3] == 1).all() and (cut != 0).all()
        if final_obs:  # the value of the observation that ended the episode
            assert not torch.allclose(cut, exp.values[3])
        else:
            torch.testing.assert_close(cut, exp.values[3])
        assert (exp.trunc_values[:3] == 0).all()


def test_asset_checks_fail_fast_with_one_line(tmp_path: Path) -> None:
    from rlinf_sim_isaaclab.sim import asset_paths, check_assets

    class Spawn:
        def __init__(self, p):
            self.usd_path = p

    class Robot:
        def __init__(self, p):
            self.spawn = Spawn(p)

    class Scene:
        def __init__(self):
            self.robot = Robot(str(tmp_path / "Isaac/Robots/ant.usd"))
            self.others = [Robot("https://example.invalid/x.usd")]

    paths = asset_paths(Scene())
    assert str(tmp_path / "Isaac/Robots/ant.usd") in paths and "https://example.invalid/x.usd" in paths
    with pytest.raises(UserError, match=r"asset missing: .*ant\.usd.*make isaaclab"):
        check_assets(paths, "Isaac-Ant-Direct", 2.0)
    (tmp_path / "Isaac/Robots").mkdir(parents=True)
    (tmp_path / "Isaac/Robots/ant.usd").write_text("#usda 1.0\n")
    t0 = time.monotonic()
    with pytest.raises(UserError, match="cannot reach NVIDIA's asset server"):
        check_assets([str(tmp_path / "Isaac/Robots/ant.usd"), "http://127.0.0.1:9/x.usd"], "Isaac-Ant-Direct", 2.0)
    assert time.monotonic() - t0 < 10


def test_sim_isaaclab_without_isaac_lab_says_how_to_get_it() -> None:
    try:
        import isaaclab_tasks  # noqa: F401
        pytest.skip("Isaac Lab is installed here")
    except ImportError:
        pass
    from rlinf_sim_isaaclab.sim import IsaacLabSimulator

    with pytest.raises(UserError, match="make isaaclab"):
        IsaacLabSimulator({"task": "Isaac-Cartpole-Direct", "torch_threads": 0})


def test_fake_env_api_shape() -> None:
    env = FakeIsaacLabEnv(3, compute_final_obs=True, max_episode_length=2)
    obs, extras = env.reset(seed=1)
    assert set(obs) == {"policy"} and obs["policy"].dtype == torch.float32 and "log" in extras
    env.step(torch.zeros(3, 1))
    obs, rew, term, tout, extras = env.step(torch.zeros(3, 1))
    assert rew.dtype == torch.float32 and term.dtype == torch.bool and tout.all() and "final_obs" in extras


def test_env_server_hosts_one_batch_per_session_one_request_per_step() -> None:
    """sim=remote against a served batched simulator: one session, one batch, one request per
    batched step, lz4 on the wire, and the same episodes as the batch stepped in this process."""
    from rlinf_executor_local.executor import LocalExecutor
    from rlinf_sim_remote.sim import RemoteSimulator

    from rlinf_cli.remote.server import EnvServer, ServeConfig

    server = EnvServer(FakeIsaacLabSimulator(horizon=6), ServeConfig(port=0), "fake-isaaclab")
    address = f"127.0.0.1:{server.start()}"
    try:
        sim = RemoteSimulator({"address": address})
        assert sim.batched and sim.default_workers(8) == 1 and not sim.spec.per_env_seeds
        remote = LocalExecutor({"name": "local", "runtime": {"mode": "hybrid", "obs_compression": "lz4"}}).make_vec_env(
            sim, 8, True)
        local = _vec(FakeIsaacLabSimulator(horizon=6), 8)
        try:
            assert len(remote.handles) == 1 and len(remote.shards) == 1
            calls = []
            submit = remote.handles[0].submit
            remote.handles[0].submit = lambda *a: calls.append(a[0]) or submit(*a)
            a, b = remote.reset([4] * 8), local.reset([4] * 8)
            np.testing.assert_array_equal(a["state"], b["state"])
            rng = np.random.default_rng(1)
            for _ in range(10):
                act = rng.uniform(-1, 1, (8, 1)).astype(np.float32)
                x, y = remote.step(act), local.step(act)
                np.testing.assert_allclose(x.obs["state"], y.obs["state"], rtol=1e-6)
                np.testing.assert_array_equal(x.truncated, y.truncated)
                np.testing.assert_array_equal(x.success, y.success)
                assert (x.final_obs is None) == (y.final_obs is None)
            assert calls == ["restore"] + ["step"] * 10
            assert x.stats["transport/obs_bytes"] > 0
        finally:
            remote.close()
            local.close()
    finally:
        server.stop(grace=0)


def test_grpo_refuses_a_batch_seeded_simulator(cli) -> None:
    from rlinf_cli.remote.server import EnvServer, ServeConfig

    server = EnvServer(FakeIsaacLabSimulator(), ServeConfig(port=0), "fake-isaaclab")
    address = f"127.0.0.1:{server.start()}"
    try:
        res = cli("rl", "--algo", "grpo", "sim=remote", f"sim.address={address}", "total_steps=100",
                  "tracking.enabled=false")
    finally:
        server.stop(grace=0)
    assert res.code == 2, res.err
    assert "per_env_seeds=False" in res.err and "--algo ppo" in res.err and "Traceback" not in res.err
