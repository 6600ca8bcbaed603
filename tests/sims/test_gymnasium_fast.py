"""rlinf_sim_gymnasium.fast: the fast step of Hopper/Walker2d/HalfCheetah/Ant-v5 gives exactly what
gymnasium's step gives (observations, rewards, terminations, truncations, info), through resets."""

from __future__ import annotations

import numpy as np
import pytest

pytestmark = pytest.mark.numerics  # results depend on CPU features: make test-portable runs them again

# Ant under random actions rarely leaves its healthy heights within 15 steps: a narrower range
# (read from the env, as every parameter is) makes it terminate; the second Ant runs the defaults,
# and the third without contact forces in the observation.
TASKS = {"Hopper-v5": {}, "Walker2d-v5": {}, "HalfCheetah-v5": {}, "Ant-v5": {"healthy_z_range": (0.45, 0.8)},
         "Ant-v5/defaults": {}, "Ant-v5/no-forces": {"include_cfrc_ext_in_observation": False,
                                                      "healthy_z_range": (0.45, 0.8)}}


def _same(a: tuple, b: tuple) -> None:
    (obs_a, r_a, te_a, tr_a, info_a), (obs_b, r_b, te_b, tr_b, info_b) = a, b
    assert obs_a.dtype == obs_b.dtype and np.array_equal(obs_a, obs_b)
    assert r_a == r_b and bool(te_a) == bool(te_b) and bool(tr_a) == bool(tr_b)
    assert info_a.keys() == info_b.keys() and all(info_a[k] == info_b[k] for k in info_a)


@pytest.mark.parametrize("case", sorted(TASKS))
def test_fast_step_equals_gymnasiums_step_through_resets(case):
    import gymnasium as gym

    from rlinf_sim_gymnasium.fast import fast_step

    task = case.split("/")[0]
    plain, fast = (gym.make(task, disable_env_checker=True, max_episode_steps=15, **TASKS[case]) for _ in range(2))
    step = fast_step(fast)
    assert step is not None
    rng = np.random.default_rng(0)
    seed, ends = 0, {"terminated": 0, "truncated": 0}
    obs_a, _ = plain.reset(seed=seed)
    obs_b, _ = fast.reset(seed=seed)
    assert np.array_equal(obs_a, obs_b)
    for i in range(400):
        # float32 actions as rlinf's policies send them, now and then far outside the bounds
        action = rng.uniform(-1, 1, size=plain.action_space.shape).astype(np.float32) * (3 if i % 7 == 0 else 1)
        a, b = plain.step(action), step(action)
        _same(a, b)
        if a[2] or a[3]:
            ends["terminated" if a[2] else "truncated"] += 1
            seed += 1
            obs_a, _ = plain.reset(seed=seed)
            obs_b, _ = fast.reset(seed=seed)
            assert np.array_equal(obs_a, obs_b)
    assert ends["truncated"] > 0 and (task == "HalfCheetah-v5" or case == "Ant-v5/defaults" or ends["terminated"] > 0), ends
    with pytest.raises(ValueError, match="Action dimension mismatch"):
        step(np.zeros(plain.action_space.shape[0] + 1))


def test_other_tasks_and_extra_wrappers_keep_gymnasiums_step():
    import gymnasium as gym

    from rlinf_sim_gymnasium.fast import fast_step

    assert fast_step(gym.make("Swimmer-v5", disable_env_checker=True)) is None
    assert fast_step(gym.make("CartPole-v1", disable_env_checker=True)) is None
    assert fast_step(gym.wrappers.ClipAction(gym.make("Hopper-v5", disable_env_checker=True))) is None


@pytest.mark.parametrize("fast", [True, False])
def test_the_simulator_steps_the_same_with_and_without_it(fast):
    from rlinf_sim_gymnasium.sim import GymnasiumSimulator

    envs = [GymnasiumSimulator({"env_id": "Hopper-v5", "fast_step": f}).make_env(0) for f in (fast, False)]
    assert (getattr(envs[0]._step, "__self__", None) is None) is fast  # the fast step is a closure, not env.step
    rng = np.random.default_rng(1)
    outs = [env.reset(seed=3)[0]["state"] for env in envs]
    assert np.array_equal(*outs)
    for _ in range(50):
        action = rng.uniform(-1, 1, size=3).astype(np.float32)
        (o1, r1, te1, tr1, _), (o2, r2, te2, tr2, _) = (env.step(action) for env in envs)
        assert np.array_equal(o1["state"], o2["state"]) and (r1, te1, tr1) == (r2, te2, tr2)
        if te1 or tr1:
            break


def test_camera_images_are_the_same_with_the_fast_step():
    from rlinf_sim_gymnasium.sim import GymnasiumSimulator

    envs = [GymnasiumSimulator({"env_id": "Hopper-v5", "obs": "state_rgb", "image_size": 48, "fast_step": f}).make_env(0)
            for f in (True, False)]
    try:
        first = [env.reset(seed=1)[0] for env in envs]
        assert np.array_equal(first[0]["rgb"], first[1]["rgb"])
        rng = np.random.default_rng(0)
        for _ in range(20):
            action = rng.uniform(-1, 1, size=3).astype(np.float32)
            (o1, *_), (o2, *_) = (env.step(action) for env in envs)
            assert np.array_equal(o1["rgb"], o2["rgb"]) and np.array_equal(o1["state"], o2["state"])
    finally:
        for env in envs:
            env.close()
