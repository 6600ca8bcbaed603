"""The robot scaffold (`rlinf plugins new NAME --kind robot`): safety hook, human input, and a fake
robot with 50 ms latency that learns cart-pole control through `rlinf env serve`."""

from __future__ import annotations

import importlib
import json
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from rlinf_cli.remote.server import EnvServer, ServeConfig
from rlinf_cli.scaffold import new_plugin


@pytest.fixture
def robot(tmp_path, monkeypatch):
    """The scaffolded robot package, importable (and importable by spawned server workers)."""
    path = new_plugin("fakebot_t", "robot", tmp_path / "plugins")
    monkeypatch.syspath_prepend(str(path))
    monkeypatch.setenv("PYTHONPATH", str(path))
    for name in [m for m in list(importlib.sys.modules) if m.startswith("rlinf_robot_fakebot_t")]:
        del importlib.sys.modules[name]
    return importlib.import_module("rlinf_robot_fakebot_t.sim")


def test_scaffold_layout_and_registration(robot) -> None:
    plugin = importlib.import_module("rlinf_robot_fakebot_t.plugin")
    got = []
    plugin.register_simulators(register=lambda name, factory, **kw: got.append((name, factory)))
    assert got == [("fakebot_t", "rlinf_robot_fakebot_t.sim:Simulator")]
    root = Path(robot.__file__).parents[1]
    assert (root / "rlinf_robot_fakebot_t" / "conf" / "sim" / "fakebot_t.yaml").is_file()
    assert "rlinf env serve sim=fakebot_t" in (root / "README.md").read_text()


def test_actions_are_clipped_before_the_hardware(robot) -> None:
    env = robot.RobotEnv({"latency_s": 0.0, "action_limit": 0.5})
    sent = []
    real = env.robot.command
    env.robot.command = lambda a: (sent.append(np.array(a)), real(a))
    env.reset(seed=1)
    env.step(np.array([5.0], np.float32))
    env.step(np.array([-0.2], np.float32))
    assert [float(a[0]) for a in sent] == [0.5, pytest.approx(-0.2)]


def test_leaving_the_safe_region_triggers_the_emergency_stop(robot) -> None:
    env = robot.RobotEnv({"latency_s": 0.0, "safe_position": 0.02})
    env.reset(seed=0)
    safety = importlib.import_module("rlinf_robot_fakebot_t.safety")
    with pytest.raises(safety.EmergencyStop, match="emergency stop: cart position .* outside the safe range"):
        for _ in range(100):
            env.step(np.array([1.0], np.float32))
    assert env.robot.stopped
    with pytest.raises(safety.EmergencyStop, match="emergency-stopped"):  # nothing moves any more
        env.step(np.array([0.0], np.float32))


def test_a_person_confirms_resets_and_judges_success(robot, tmp_path) -> None:
    inbox = tmp_path / "operator"
    env = robot.RobotEnv({"latency_s": 0.0, "operator": "files", "operator_dir": str(inbox), "operator_timeout_s": 20})
    done = threading.Event()
    t = threading.Thread(target=lambda: (env.reset(seed=3), done.set()))
    t.start()
    deadline = time.monotonic() + 10
    while not (inbox / "reset_requested").exists() and time.monotonic() < deadline:
        time.sleep(0.02)
    assert (inbox / "reset_requested").read_text().strip() == "seed 3"
    assert not done.is_set()  # waiting for the person
    (inbox / "reset_done").write_text("")
    t.join(10)
    assert done.is_set()
    _, _, term, _, info = env.step(np.array([0.0], np.float32))
    assert not term
    (inbox / "success").write_text("")
    _, _, term, trunc, info = env.step(np.array([0.0], np.float32))
    assert term and not trunc and info["success"]


def test_emergency_stop_through_the_server_is_one_line(robot, cli) -> None:
    sim = robot.Simulator({"latency_s": 0.0, "safe_position": 0.05})
    server = EnvServer(sim, ServeConfig(port=0, start_method="spawn"), "fakebot_t")
    port = server.start()
    try:
        res = cli("rl", "--algo", "ppo", "sim=remote", f"sim.address=127.0.0.1:{port}", "sim.sessions_per_server=1",
                  "num_envs=2", "total_steps=3000", "eval.episodes=0", "tracking.enabled=false", "progress=false")
    finally:
        server.stop(grace=0)
    assert res.code in (2, 3)  # an env worker's failure: one line, no traceback
    last = res.err.strip().splitlines()[-1]
    assert last.startswith("error: env worker 0") and "emergency stop: cart position" in last and "Traceback" not in res.err


@pytest.mark.slow
@pytest.mark.learning
def test_fake_robot_with_50ms_latency_learns_through_the_server(robot, cli, workdir, learning) -> None:
    sim = robot.Simulator({"latency_s": 0.05, "max_episode_steps": 100})
    server = EnvServer(sim, ServeConfig(port=0, start_method="spawn"), "fakebot_t")
    port = server.start()
    t0 = time.monotonic()
    try:
        res = cli("rl", "--algo", "ppo", "sim=remote", f"sim.address=127.0.0.1:{port}", "sim.sessions_per_server=8",
                  "num_envs=8", "total_steps=8000", "algo.rollout_steps=100", "algo.minibatch_size=200", "algo.lr=0.001",
                  "algo.gamma=0.98", "checkpoint.interval=100", "eval.episodes=0", "tracking.enabled=false",
                  "progress=false", "run_dir=robot_run", f"seed={learning.seed}")
    finally:
        server.stop(grace=0)
    elapsed = time.monotonic() - t0
    assert res.code == 0, res.err
    rows = [json.loads(line) for line in (workdir / "robot_run" / "metrics.jsonl").read_text().splitlines()]
    returns = [r["rollout/return_mean"] for r in rows if "rollout/return_mean" in r]
    first, last = returns[0], float(np.mean(returns[-2:]))
    # 8,000 steps at >= 50 ms each, 8 robots at a time: the latency is really paid (>= 50 s) ...
    assert elapsed >= 8000 / 8 * 0.05
    # ... and the policy learns: episode return (steps balanced, max 100) well up from the start
    learning.record(last, 45, first=first)
    assert last >= 2 * first and last >= 45, returns
