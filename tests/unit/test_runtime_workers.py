"""Env workers: placement modes agree with the in-process reference, recover from crashes."""

from __future__ import annotations

import os
import signal

import numpy as np
import pytest

from fake_sims import CounterSim
from rlinf_cli.runtime.placement import choose_mode, plan_shards
from rlinf_cli.runtime.workers import EnvWorkerError
from rlinf_executor_local.executor import LocalExecutor


def _executor(mode: str, **runtime) -> LocalExecutor:
    return LocalExecutor({"name": "local", "runtime": {"mode": mode, "env_workers": 2, **runtime}})


def _trace(env, steps: int = 12, seed0: int = 10) -> list:
    """Reset, then step with fixed actions; every output that a runner would see."""
    n = env.num_envs
    out = [env.reset([seed0 + i for i in range(n)])]
    for t in range(steps):
        sb = env.step(np.full(n, t % 3, dtype=np.int64))
        out.append((sb.obs, sb.reward, sb.terminated, sb.truncated, sb.success, sb.final_obs))
    return out


def _assert_same(a, b) -> None:
    if isinstance(a, dict):
        assert a.keys() == b.keys()
        for k in a:
            _assert_same(a[k], b[k])
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b)
        for x, y in zip(a, b):
            _assert_same(x, y)
    elif a is None:
        assert b is None
    else:
        np.testing.assert_array_equal(a, b)


def test_plan_shards_covers_every_env_once() -> None:
    for n, w, g in [(8, 2, 2), (7, 3, 2), (5, 2, 3), (4, 4, 1), (3, 1, 3)]:
        shards = plan_shards(n, w, g)
        covered = sorted(i for s in shards for i in range(s.lo, s.hi))
        assert covered == list(range(n))
        for grp in range(g):  # a pipeline group is one contiguous block
            rows = sorted(i for s in shards if s.group == grp for i in range(s.lo, s.hi))
            assert rows == list(range(rows[0], rows[-1] + 1))


@pytest.mark.parametrize("autoreset", [True, False])
@pytest.mark.parametrize("mode,extra", [("disaggregated", {}), ("hybrid", {}),
                                        ("disaggregated", {"shared_memory": True}),
                                        ("hybrid", {"obs_compression": "lz4", "obs_delta": True})])
def test_worker_modes_match_collocated(autoreset: bool, mode: str, extra: dict) -> None:
    sim = CounterSim(horizon=4, image=True)
    ref_env = _executor("collocated").make_vec_env(sim, 5, autoreset)
    env = _executor(mode, **extra).make_vec_env(sim, 5, autoreset)
    try:
        _assert_same(_trace(ref_env), _trace(env))
        _assert_same(_trace(ref_env, seed0=99), _trace(env, seed0=99))  # a second reset on the same workers
    finally:
        env.close()
        ref_env.close()


def test_transport_stats_report_bytes_and_codec_time() -> None:
    sim = CounterSim(image=True)
    env = _executor("disaggregated", obs_compression="lz4", obs_delta=True).make_vec_env(sim, 4, True)
    try:
        env.reset([0, 1, 2, 3])
        sb = env.step(np.zeros(4, dtype=np.int64))
        raw = 4 * (3 * 4 + 16 * 16 * 3)
        assert sb.stats["transport/obs_bytes_raw"] == raw
        assert 0 < sb.stats["transport/obs_bytes"] < raw / 4
        assert sb.stats["transport/encode_s"] > 0 and sb.stats["transport/decode_s"] > 0
    finally:
        env.close()


def test_pipelined_groups_match_a_synchronous_step() -> None:
    sim = CounterSim(horizon=3)
    ref = _executor("collocated").make_vec_env(sim, 6, True)
    env = _executor("hybrid", pipeline_stages=3).make_vec_env(sim, 6, True)
    try:
        assert env.pipeline_groups == [(0, 2), (2, 4), (4, 6)]
        ref.reset(list(range(6)))
        env.reset(list(range(6)))
        for t in range(7):
            a = np.full(6, t % 3, dtype=np.int64)
            want = ref.step(a)
            for g, (lo, hi) in enumerate(env.pipeline_groups):
                env.step_group_async(g, a[lo:hi])
            for g, (lo, hi) in reversed(list(enumerate(env.pipeline_groups))):  # any order of waiting
                got = env.step_group_wait(g)
                np.testing.assert_array_equal(got.obs["state"], want.obs["state"][lo:hi])
                np.testing.assert_array_equal(got.reward, want.reward[lo:hi])
                np.testing.assert_array_equal(got.truncated, want.truncated[lo:hi])
    finally:
        env.close()
        ref.close()


def test_killed_worker_is_restarted_and_its_episodes_truncated(capsys) -> None:
    sim = CounterSim(horizon=50)
    env = _executor("disaggregated", max_restarts=1).make_vec_env(sim, 4, True)
    try:
        env.reset([0, 1, 2, 3])
        before = env.step(np.ones(4, dtype=np.int64))
        os.kill(env.handles[1].proc.pid, signal.SIGKILL)
        sb = env.step(np.ones(4, dtype=np.int64))
        assert "env worker 1 (envs 2-3) died during step" in capsys.readouterr().err
        assert sb.truncated.tolist() == [False, False, True, True]  # worker 1 hosted envs 2-3
        assert sb.reward.tolist() == [1.0, 1.0, 0.0, 0.0]
        np.testing.assert_array_equal(sb.final_obs["state"][2:], before.obs["state"][2:])
        assert sb.obs["state"][2, 2] == 0.0  # a fresh episode
        assert sb.stats["runtime/worker_restarts"] == 1.0
        after = env.step(np.ones(4, dtype=np.int64))  # the new worker steps on
        assert after.obs["state"][2, 2] == 1.0 and after.obs["state"][0, 2] == 3.0
        os.kill(env.handles[1].proc.pid, signal.SIGKILL)
        with pytest.raises(EnvWorkerError, match=r"env worker 1 \(envs 2-3\) died during step .*max_restarts=1"):
            env.step(np.ones(4, dtype=np.int64))
    finally:
        env.close()


def test_restart_budget_is_per_worker(capsys) -> None:
    """runtime.max_restarts counts per env worker (env batch): worker 0's restarts leave worker 1's
    budget whole (issue 31: worker 1, restarted once, hit a limit of 3 shared with worker 0)."""
    env = _executor("disaggregated", max_restarts=2).make_vec_env(CounterSim(horizon=50), 4, True)
    try:
        env.reset([0, 1, 2, 3])
        for w in (0, 0, 1, 1):
            os.kill(env.handles[w].proc.pid, signal.SIGKILL)
            sb = env.step(np.ones(4, dtype=np.int64))
            assert sb.truncated.tolist() == [w == 0] * 2 + [w == 1] * 2
        assert env.restarts == [2, 2]
        assert "restarting it (2/2 for this worker)" in capsys.readouterr().err
        os.kill(env.handles[1].proc.pid, signal.SIGKILL)
        with pytest.raises(EnvWorkerError, match=r"env worker 1 \(envs 2-3\) died during step .*restarted 2 time\(s\) "
                                                 r"already \(runtime.max_restarts=2, per env worker\)"):
            env.step(np.ones(4, dtype=np.int64))
    finally:
        env.close()


def test_restart_warning_is_one_plain_line(capsys) -> None:
    """A restart is said on one console line (`warning: ...` on stderr), not through Python's
    `warnings` with a file path and a source line (issue 31)."""
    import warnings

    env = _executor("disaggregated", max_restarts=1).make_vec_env(CounterSim(horizon=50), 4, True)
    try:
        env.reset([0, 1, 2, 3])
        capsys.readouterr()
        os.kill(env.handles[0].proc.pid, signal.SIGKILL)
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # any Python warning fails the test
            env.step(np.ones(4, dtype=np.int64))
        err = capsys.readouterr().err
        assert err.startswith("warning: env worker 0 (envs 0-1) died during step (process ") and err.count("\n") == 1
        assert err.endswith("restarting it (1/1 for this worker); its running episodes count as truncated\n")
        assert ".py" not in err and "Warning" not in err
    finally:
        env.close()


def test_worker_crash_inside_the_simulator_in_hybrid_mode() -> None:
    sim = CounterSim(horizon=50, fail_env=0, fail_at=3)  # env 0's process exits at its 3rd step
    env = _executor("hybrid", max_restarts=0).make_vec_env(sim, 4, True)
    try:
        env.reset([0, 1, 2, 3])
        env.step(np.zeros(4, dtype=np.int64))
        env.step(np.zeros(4, dtype=np.int64))
        with pytest.raises(EnvWorkerError, match="exited with code 7"):
            env.step(np.zeros(4, dtype=np.int64))
    finally:
        env.close()


def test_simulator_exception_is_reported_in_one_line() -> None:
    sim = CounterSim(horizon=50, fail_env=3, fail_at=1, fail_how="raise")
    env = _executor("disaggregated").make_vec_env(sim, 4, True)
    try:
        env.reset([0, 1, 2, 3])
        with pytest.raises(EnvWorkerError, match=r"envs 2-3\) failed in step: ValueError: simulated physics blow-up"):
            env.step(np.zeros(4, dtype=np.int64))
    finally:
        env.close()


def test_choose_mode_follows_the_costs() -> None:
    cheap = choose_mode(sim_s=50e-6, infer_s=100e-6, num_envs=8, cores=2)
    assert cheap.mode == "collocated"
    slow_sim = choose_mode(sim_s=20e-3, infer_s=0.1e-3, num_envs=8, cores=2)
    assert slow_sim.mode == "disaggregated"
    balanced = choose_mode(sim_s=10e-3, infer_s=4e-3, num_envs=8, cores=2)
    assert balanced.mode == "hybrid" and balanced.stages == 2
    assert "chose hybrid" in balanced.reason and "10.00 ms to simulate" in balanced.reason
    assert choose_mode(sim_s=20e-3, infer_s=4e-3, num_envs=8, cores=1).mode == "collocated"


def test_auto_resolves_once_and_says_why() -> None:
    ex = _executor("auto")
    env = ex.make_vec_env(CounterSim(), 4, True)
    try:
        assert ex.choice is not None and ex.choice.mode == "collocated"  # microsecond steps: workers do not pay
        assert ex.choice.reason.startswith("runtime.mode=auto chose collocated")
        assert "collocated" in ex.describe()
    finally:
        env.close()


def test_workers_see_the_drivers_environment_of_now(monkeypatch) -> None:
    """forkserver children inherit the server's frozen environment; workers must get the driver's."""
    _executor("disaggregated").make_vec_env(CounterSim(), 2, True).close()  # the fork server is up
    monkeypatch.setenv("RLINF_TEST_PROBE", "17")  # e.g. MUJOCO_GL set by a simulator after that
    env = _executor("disaggregated").make_vec_env(CounterSim(probe_env="RLINF_TEST_PROBE"), 2, True)
    try:
        assert env.reset([0, 1])["state"][:, 3].tolist() == [17.0, 17.0]
    finally:
        env.close()


class _PlanRecorder:
    """An executor written from ``rlinf_cli.api`` alone: it only starts the workers the core plans."""

    @staticmethod
    def make(fail: bool = False):
        from rlinf_cli.api import RemoteError, WorkerExecutor, start_processes

        class Mine(WorkerExecutor):
            name = "mine"
            in_process = False
            shared_memory = True

            def start_workers(self, plan):
                self.plans.append(plan)
                if fail:
                    raise RemoteError("Traceback (most recent call last):\nValueError: no envs here")
                return start_processes(plan)

        ex = Mine({"name": "mine", "runtime": {"mode": "hybrid", "env_workers": 2, "shared_memory": True}})
        ex.plans = []
        return ex


def test_the_core_plans_and_an_executor_only_starts_workers() -> None:
    sim = CounterSim(horizon=4, image=True)
    ex = _PlanRecorder.make()
    ref_env = _executor("collocated").make_vec_env(sim, 4, True)
    env = ex.make_vec_env(sim, 4, True)
    try:
        (plan,) = ex.plans
        assert plan.num_workers == 2 and plan.stages == 2 and plan.shm_name is not None
        assert plan.shards == (((0, 2),), ((2, 4),))
        assert plan.worker_args(1)[1:3] == ([(2, 4)], True)
        assert ex.describe() == "mine, hybrid: 4 envs in 2 worker(s)"
        _assert_same(_trace(ref_env), _trace(env))
    finally:
        env.close()
        ref_env.close()


def test_a_worker_that_cannot_start_is_one_line_and_frees_the_shared_memory() -> None:
    import multiprocessing.shared_memory as shm

    ex = _PlanRecorder.make(fail=True)
    with pytest.raises(EnvWorkerError, match=r"^an env worker failed to create its envs: ValueError: no envs here$"):
        ex.make_vec_env(CounterSim(image=True), 4, True)
    with pytest.raises(FileNotFoundError):
        shm.SharedMemory(name=ex.plans[0].shm_name)
