"""The Meta-World simulator plugin against rlinf's simulator contract."""

from __future__ import annotations

import pickle
import time

import numpy as np
import pytest


from rlinf_cli.api import TASK_KEY, EnvSpec  # noqa: E402
from rlinf_cli.errors import UserError  # noqa: E402
from rlinf_cli.runtime.rollout import run_episodes  # noqa: E402
from rlinf_cli.runtime.vector import SyncVecEnv  # noqa: E402
from rlinf_cli import policy_factory as common  # noqa: E402


def make(**cfg):
    from rlinf_sim_metaworld.sim import MetaWorldSimulator

    return MetaWorldSimulator({"name": "metaworld", **cfg})


def object_and_goal(obs):
    """Object positions (state[4:18]) and goal (state[36:39]): what a seed must fix."""
    s = obs["state"]
    return np.concatenate([s[..., 4:18], s[..., 36:39]], axis=-1)


def test_registered_and_fast_import(cli_proc):
    res = cli_proc("plugins", "list", "--json")
    assert res.code == 0
    assert any(p["name"] == "metaworld" and p["kind"] == "simulator" for p in __import__("json").loads(res.out))
    import subprocess
    import sys

    code = ("import sys; from rlinf_cli.registry import get_registry; get_registry(); "
            "bad = [m for m in ('metaworld', 'mujoco', 'torch') if m in sys.modules]; print(bad); assert not bad")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr


def test_spec_step_and_truncation():
    sim = make(task="push-v3", max_episode_steps=7)
    spec = sim.spec
    assert isinstance(spec, EnvSpec) and spec.has_success and spec.tasks == ("push-v3",)
    assert spec.observation["state"].shape == (39,) and spec.observation[TASK_KEY].dtype == "int64"
    assert spec.action.shape == (4,) and (spec.action.low, spec.action.high) == (-1.0, 1.0)
    assert spec.max_episode_steps == 7 and EnvSpec.from_dict(spec.to_dict()) == spec
    sim2 = pickle.loads(pickle.dumps(sim))  # executors ship simulators to worker processes
    env = sim2.make_env(0)
    obs, info = env.reset(seed=3)
    assert set(obs) == set(spec.observation) and info["task"] == "push-v3"
    for key, s in spec.observation.items():
        if s.is_text:  # the task's instruction
            assert isinstance(obs[key], str) and obs[key]
            continue
        assert obs[key].shape == s.shape and obs[key].dtype == np.dtype(s.dtype)
    for t in range(7):
        obs, reward, term, trunc, info = env.step(np.zeros(4, dtype=np.float32))
        assert reward == 0.0 and not term and isinstance(info["success"], bool)
        assert trunc == (t == 6)
    env.close()


def test_reset_is_a_function_of_the_seed():
    sim = make(task="pick-place-v3")
    a, b = sim.make_env(0), sim.make_env(5)
    first = object_and_goal(a.reset(seed=11)[0])
    a.reset(seed=12)
    for _ in range(3):
        a.step(np.ones(4, dtype=np.float32))
    again = object_and_goal(a.reset(seed=11)[0])  # after other episodes, in the same env
    other_env = object_and_goal(b.reset(seed=11)[0])  # in another env instance
    np.testing.assert_array_equal(first, again)
    np.testing.assert_array_equal(first, other_env)
    assert not np.allclose(first, object_and_goal(b.reset(seed=12)[0]))
    # unseeded resets (auto-reset) continue deterministically from the last seeded one
    a.reset(seed=40)
    b.reset(seed=40)
    np.testing.assert_array_equal(object_and_goal(a.reset()[0]), object_and_goal(b.reset()[0]))
    a.close()
    b.close()


def test_grpo_group_shares_its_initial_state_and_rollouts_differ():
    """A group (G envs reset with one seed) starts from one state; sampled actions then differ."""
    sim = make(task="push-v3", max_episode_steps=5)
    env = SyncVecEnv(sim, range(6), autoreset=False)
    seen = []

    def act(obs):
        seen.append(obs)
        return None, np.random.default_rng(len(seen)).uniform(-1, 1, (6, 4)).astype(np.float32)

    run_episodes(env, act, [7, 7, 7, 9, 9, 9])
    start = object_and_goal(seen[0])
    np.testing.assert_array_equal(start[0], start[1])
    np.testing.assert_array_equal(start[0], start[2])
    np.testing.assert_array_equal(start[3], start[5])
    assert not np.allclose(start[0], start[3])
    hand_later = seen[-1]["state"][:, :3]
    assert not np.allclose(hand_later[0], hand_later[1])  # different actions, different states
    env.close()


def test_expert_solves_reach_and_sparse_reward_is_success():
    sim = make(task="reach-v3", max_episode_steps=150)
    env = SyncVecEnv(sim, range(5), autoreset=False)
    expert = common.expert_actor(sim)
    episodes = run_episodes(env, expert, list(range(100, 110))[:5])
    env.close()
    assert np.mean([e.success_once for e in episodes]) >= 0.8
    for e in episodes:  # terminate_on_success: the return is the success, the last step the solved one
        assert e.ret == float(e.success_once) and e.success_at_end == e.success_once
        assert e.task == 0


def test_shaped_reward_runs_past_success_unless_asked_to_stop():
    """Ending at success would cost a shaped-reward policy the rest of the episode's reward (up to
    10 per step), teaching it to avoid success: with reward=shaped the default runs to the limit."""
    sim = make(task="reach-v3", max_episode_steps=80, reward="shaped")
    env = SyncVecEnv(sim, range(3), autoreset=False)
    episodes = run_episodes(env, common.expert_actor(sim), [100, 101, 102])
    env.close()
    assert all(e.success_once for e in episodes) and all(e.length == 80 for e in episodes)
    assert all(e.ret > 80 for e in episodes)  # dense reward on every step, ~10 near the goal
    stop = make(task="reach-v3", max_episode_steps=80, reward="shaped", terminate_on_success=True)
    env = SyncVecEnv(stop, range(3), autoreset=False)
    episodes = run_episodes(env, common.expert_actor(stop), [100, 101, 102])
    env.close()
    assert all(e.success_once and e.length < 80 for e in episodes)


def test_multi_task_seed_selects_task():
    sim = make(tasks=["reach-v3", "push-v3", "door-open-v3"], max_episode_steps=3)
    assert sim.spec.tasks == ("reach-v3", "push-v3", "door-open-v3")
    env = sim.make_env(0)
    for seed in (30, 31, 32, 33):
        obs, info = env.reset(seed=seed)
        assert int(obs[TASK_KEY]) == seed % 3 and info["task"] == sim.spec.tasks[seed % 3]
    env.close()
    mt10 = make(benchmark="MT10")
    assert len(mt10.spec.tasks) == 10 and mt10.spec.tasks[0] == "reach-v3"
    expert = mt10.expert()
    env = mt10.make_env(0)
    obs, _ = env.reset(seed=1)  # push-v3
    assert expert(obs, 0).shape == (4,)
    env.close()


def test_pixels_upright_and_deterministic():
    import mujoco

    sim = make(task="button-press-v3", obs="state_rgb", image_size=32)
    spec = sim.spec
    assert spec.observation["rgb"].shape == (32, 32, 3) and spec.observation["rgb"].dtype == "uint8"
    assert spec.observation["proprio"].shape == (8,)
    env = sim.make_env(0)
    obs, _ = env.reset(seed=2)
    assert obs["rgb"].shape == (32, 32, 3) and obs["rgb"].dtype == np.uint8 and obs["rgb"].std() > 5
    np.testing.assert_array_equal(obs["proprio"][:4], obs["state"][:4])
    # the corner camera is mounted upside down: our image is MuJoCo's rotated by 180 degrees
    raw = mujoco.Renderer(env._env.model, 32, 32)
    for flag in (mujoco.mjtRndFlag.mjRND_SHADOW, mujoco.mjtRndFlag.mjRND_REFLECTION, mujoco.mjtRndFlag.mjRND_SKYBOX):
        raw.scene.flags[flag] = False
    raw.update_scene(env._env.data, camera="corner")
    np.testing.assert_array_equal(obs["rgb"], raw.render()[::-1, ::-1])
    raw.close()
    again, _ = env.reset(seed=2)
    np.testing.assert_array_equal(obs["rgb"], again["rgb"])
    env.close()
    pixels_only = make(task="button-press-v3", obs="rgb", image_size=32)
    assert "state" not in pixels_only.spec.observation
    with pytest.raises(UserError, match="state_rgb"):
        pixels_only.expert()


def test_chunks_from_pixels_render_only_the_observation_they_return():
    """A chunk of 4 steps renders once (its last step's camera), not 4 times, and returns exactly
    what stepping the plain env 4 times returns; a chunk cut short by the episode's end renders
    the end state."""
    from rlinf_cli.runtime.chunking import ChunkedEnv

    class Counting:
        def __init__(self, inner):
            self.inner, self.calls = inner, 0

        def render(self, data):
            self.calls += 1
            return self.inner.render(data)

    sim = make(task="button-press-v3", obs="state_rgb", image_size=32, max_episode_steps=10)
    plain, chunked = sim.make_env(0), sim.make_env(1)
    chunks = np.random.default_rng(0).uniform(-1, 1, size=(3, 4, 4)).astype(np.float32)
    plain.reset(seed=5)
    chunked.reset(seed=5)
    renderers, key = chunked._env._rlinf_renderers, (sim.cfg.camera, 32)
    original = renderers[key]
    counter = renderers[key] = Counting(original)
    wrapped = ChunkedEnv(chunked, 4)
    try:
        for c, chunk in enumerate(chunks):  # steps 1-4, 5-8, then 9-10 where the episode is truncated
            total = 0.0
            for a in chunk:
                obs, reward, term, trunc, _ = plain.step(a)
                total += reward
                if term or trunc:
                    break
            got, got_reward, got_term, got_trunc, info = wrapped.step(chunk)
            assert counter.calls == c + 1
            assert (got_reward, got_term, got_trunc) == (total, term, trunc)
            for k in obs:
                np.testing.assert_array_equal(got[k], obs[k])
        assert got_trunc and info["chunk_steps"] == 2
    finally:
        renderers[key] = original  # the env goes back to the per-process pool: leave no test double in it
        plain.close()
        chunked.close()


def test_envs_are_pooled():
    sim = make(task="drawer-close-v3")
    env = sim.make_env(0)
    env.reset(seed=0)
    raw = env._env
    env.close()
    t0 = time.perf_counter()
    env = sim.make_env(1)
    env.reset(seed=0)
    assert env._env is raw and time.perf_counter() - t0 < 0.5
    env.close()


@pytest.mark.parametrize("cfg, match", [
    ({"task": "psuh-v3"}, "Did you mean 'push-v3'"),
    ({"tasks": ["push-v3", "push-v3"]}, "twice"),
    ({"obs": "depth"}, "obs must be one of"),
    ({"reward": "dense"}, "reward must be"),
    ({"camera_name": "corner"}, "not an option"),
])
def test_bad_config_is_one_clear_error(cfg, match):
    with pytest.raises(UserError, match=match):
        make(**cfg)


def test_fast_helpers_give_metaworlds_numbers():
    """The vectorised contact check and quaternion are exact stand-ins for Meta-World's own."""
    from scipy.spatial.transform import Rotation

    from rlinf_sim_metaworld.fast import _MatrixQuat, touching_object

    for m in Rotation.random(200, random_state=0).as_matrix():  # every branch (trace / diagonal)
        np.testing.assert_allclose(_MatrixQuat.from_matrix(m).as_quat(), Rotation.from_matrix(m).as_quat(), atol=1e-12)
    sim = make(task="pick-place-v3")
    env = sim.make_env(0)
    expert = sim.expert()
    obs, _ = env.reset(seed=3)
    raw = env._env
    touched = 0
    for _ in range(50):
        obs, *_ = env.step(expert(obs, 0))
        oid = raw._get_id_main_object()
        original = type(raw).touching_object(raw, oid)  # the class's method, not the instance's
        assert touching_object(raw, oid) == original
        touched += original
    assert touched > 0  # the expert grasped the puck: the contact branch ran
    env.close()


def test_instructions_can_be_rephrased_or_swapped():
    """sim.instructions replaces each task's text (in task order): how an evaluation swaps the
    instructions between tasks to see whether a policy reads them."""
    sim = make(tasks=["reach-v3", "push-v3"], instructions=["go to the goal", "shove the puck"])
    env = SyncVecEnv(sim, [0, 1], autoreset=False)
    obs = env.reset([0, 1])  # seed s runs tasks[s % 2]
    assert list(obs["instruction"]) == ["go to the goal", "shove the puck"]
    assert list(make(tasks=["reach-v3", "push-v3"]).instructions) == ["reach the goal position", "push the puck to the goal"]
    with pytest.raises(UserError, match="one per task"):
        make(tasks=["reach-v3", "push-v3"], instructions=["only one"])
