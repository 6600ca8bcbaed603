"""A faster ``step`` for gymnasium's planar MuJoCo locomotion tasks (Hopper-v5, Walker2d-v5,
HalfCheetah-v5), with the observations, rewards, terminations, truncations and info of
``env.step`` (``tests/test_gymnasium_fast.py`` compares them step by step, resets included).

Why: a gymnasium step of these tasks spends ~40% of its time outside the physics (Hopper on this
CPU: ~170 us a step, ~80 us of it ``mj_step``): property lookups, ``is_healthy`` computed twice,
``state_vector`` concatenations, three wrapper layers. With PPO's small networks the simulator
is most of a rollout (docs/benchmarks.md, "Where rlinf's PPO time goes"). Here the same
quantities are computed once, from the env's own parameters (weights, healthy ranges, frame
skip), read when the stepper is made. Not covered: other tasks and versions, ``render_mode=
"human"``, wrappers beyond what ``gym.make`` adds (``TimeLimit``, ``OrderEnforcing``); those keep
gymnasium's step. ``mj_rnePostConstraint`` (contact forces, which none of these three
observations read) is skipped, so ``data.cfrc_*`` are not refreshed after a fast step.
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

Step = Callable[[np.ndarray], tuple[np.ndarray, float, bool, bool, dict]]

# unwrapped class -> (its module, what its step does): the v5 code these formulas were read from
_TASKS = {"HopperEnv": ("gymnasium.envs.mujoco.hopper_v5", "hopper"),
          "Walker2dEnv": ("gymnasium.envs.mujoco.walker2d_v5", "walker"),
          "HalfCheetahEnv": ("gymnasium.envs.mujoco.half_cheetah_v5", "cheetah")}


def fast_step(env: Any) -> Step | None:
    """A step function equal to ``env.step`` for the tasks above, or None (use ``env.step``)."""
    from gymnasium.wrappers import OrderEnforcing, TimeLimit

    limit, inner = None, env
    while hasattr(inner, "env") and inner is not inner.unwrapped:
        if isinstance(inner, TimeLimit) and limit is None:
            limit = inner
        elif not isinstance(inner, OrderEnforcing):
            return None  # a wrapper whose step we would skip
        inner = inner.env
    u = env.unwrapped
    task = _TASKS.get(type(u).__name__)
    if task is None or type(u).__module__ != task[0] or getattr(u, "render_mode", None) == "human":
        return None
    try:
        return _stepper(u, task[1], limit)
    except AttributeError:  # a gymnasium whose env keeps its parameters elsewhere: its own step
        return None


def _stepper(u: Any, kind: str, limit: Any) -> Step:
    import mujoco

    model, data = u.model, u.data
    n_frames, nu = int(u.frame_skip), int(model.nu)
    forward_w, ctrl_w = u._forward_reward_weight, u._ctrl_cost_weight
    skip = 1 if u._exclude_current_positions_from_observation else 0
    clip_velocity = kind != "cheetah"
    healthy_w = u._healthy_reward if kind != "cheetah" else 0.0
    terminate = bool(getattr(u, "_terminate_when_unhealthy", False))
    z_lo, z_hi = u._healthy_z_range if kind != "cheetah" else (0.0, 0.0)
    a_lo, a_hi = u._healthy_angle_range if kind != "cheetah" else (0.0, 0.0)
    s_lo, s_hi = u._healthy_state_range if kind == "hopper" else (0.0, 0.0)
    init_z = u.init_qpos[1]

    def healthy(qpos: np.ndarray, qvel: np.ndarray) -> bool:
        z, angle = qpos[1], qpos[2]
        ok = z_lo < z < z_hi and a_lo < angle < a_hi
        if ok and kind == "hopper":  # the state check over qpos[2:] and qvel
            ok = bool(np.all((s_lo < qpos[2:]) & (qpos[2:] < s_hi))) and bool(np.all((s_lo < qvel) & (qvel < s_hi)))
        return ok

    def step(action: np.ndarray) -> tuple[np.ndarray, float, bool, bool, dict]:
        if np.shape(action) != (nu,):
            raise ValueError(f"Action dimension mismatch. Expected {(nu,)}, found {np.shape(action)}")
        x_before = data.qpos[0]
        data.ctrl[:] = action
        mujoco.mj_step(model, data, nstep=n_frames)
        qpos, qvel = data.qpos, data.qvel
        x_after = qpos[0]
        x_velocity = (x_after - x_before) / u.dt
        velocity = np.clip(qvel, -10, 10) if clip_velocity else qvel
        obs = np.concatenate((qpos[skip:], velocity))
        forward = forward_w * x_velocity
        ctrl_cost = ctrl_w * np.sum(np.square(action))
        if kind == "cheetah":
            reward = forward - ctrl_cost
            terminated = False
            info = {"x_position": x_after, "x_velocity": x_velocity, "reward_forward": forward,
                    "reward_ctrl": -ctrl_cost}
        else:
            is_healthy = healthy(qpos, qvel)
            survive = is_healthy * healthy_w
            reward = (forward + survive) - ctrl_cost
            terminated = (not is_healthy) and terminate
            info = {"x_position": x_after, "z_distance_from_origin": qpos[1] - init_z, "x_velocity": x_velocity,
                    "reward_forward": forward, "reward_ctrl": -ctrl_cost, "reward_survive": survive}
        truncated = False
        if limit is not None:
            limit._elapsed_steps += 1
            truncated = limit._elapsed_steps >= limit._max_episode_steps
        return obs, reward, terminated, truncated, info

    return step
