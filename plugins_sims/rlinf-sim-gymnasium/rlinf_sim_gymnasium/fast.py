"""A faster ``step`` for gymnasium's MuJoCo locomotion tasks (Hopper-v5, Walker2d-v5,
HalfCheetah-v5, Ant-v5), with the observations, rewards, terminations, truncations and info of
``env.step`` (``tests/sims/test_gymnasium_fast.py`` compares them step by step, resets included).

Why: a gymnasium step of these tasks spends ~40% of its time outside the physics (Hopper on this
CPU: ~170 us a step, ~80 us of it ``mj_step``): property lookups, ``is_healthy`` computed twice,
``state_vector`` concatenations, three wrapper layers. With PPO's small networks the simulator
is most of a rollout (docs/benchmarks.md, "Where rlinf's PPO time goes"). Here the same
quantities are computed once, from the env's own parameters (weights, healthy ranges, frame
skip), read when the stepper is made. Not covered: other tasks and versions, ``render_mode=
"human"``, wrappers beyond what ``gym.make`` adds (``TimeLimit``, ``OrderEnforcing``); those keep
gymnasium's step. ``mj_rnePostConstraint`` (contact forces, which none of the three planar tasks'
observations read) is skipped for them, so their ``data.cfrc_*`` are not refreshed after a fast
step; Ant reads its contact forces and calls it, as gymnasium does. Ant's physics is most of its
step (~230 of ~280 us here), so there the saving is the ~50 us around it.
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

Step = Callable[[np.ndarray], tuple[np.ndarray, float, bool, bool, dict]]

# unwrapped class -> (its module, what its step does): the v5 code these formulas were read from
_TASKS = {"HopperEnv": ("gymnasium.envs.mujoco.hopper_v5", "hopper"),
          "Walker2dEnv": ("gymnasium.envs.mujoco.walker2d_v5", "walker"),
          "HalfCheetahEnv": ("gymnasium.envs.mujoco.half_cheetah_v5", "cheetah"),
          "AntEnv": ("gymnasium.envs.mujoco.ant_v5", "ant")}


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
        return _ant_stepper(u, limit) if task[1] == "ant" else _stepper(u, task[1], limit)
    except AttributeError:  # a gymnasium whose env keeps its parameters elsewhere: its own step
        return None


def _tick(limit: Any) -> bool:
    """TimeLimit's count (the wrapper stays the one ``reset`` rewinds); True when it truncates."""
    if limit is None:
        return False
    limit._elapsed_steps += 1
    return limit._elapsed_steps >= limit._max_episode_steps


def _check(action: np.ndarray, nu: int) -> None:
    if np.shape(action) != (nu,):
        raise ValueError(f"Action dimension mismatch. Expected {(nu,)}, found {np.shape(action)}")


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

    dt = u.dt  # a property (timestep x frame skip): read once
    # mjData's arrays never move (reset writes into them), so their numpy views are taken once
    qpos, qvel, ctrl = data.qpos, data.qvel, data.ctrl
    clipped = np.empty_like(qvel)

    def step(action: np.ndarray) -> tuple[np.ndarray, float, bool, bool, dict]:
        _check(action, nu)
        x_before = qpos[0]
        ctrl[:] = action
        mujoco.mj_step(model, data, nstep=n_frames)
        x_after = qpos[0]
        x_velocity = (x_after - x_before) / dt
        # np.clip(qvel, -10, 10) (NaN stays NaN) without its Python wrapper, into a buffer of this stepper
        velocity = np.minimum(np.maximum(qvel, -10, out=clipped), 10, out=clipped) if clip_velocity else qvel
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
        return obs, reward, terminated, _tick(limit), info

    return step


def _ant_stepper(u: Any, limit: Any) -> Step:
    import mujoco

    model, data = u.model, u.data
    n_frames, nu = int(u.frame_skip), int(model.nu)
    body = model.body(u._main_body).id  # an index or a name, as gymnasium's data.body() takes it
    forward_w, ctrl_w, contact_w = u._forward_reward_weight, u._ctrl_cost_weight, u._contact_cost_weight
    healthy_w, terminate = u._healthy_reward, u._terminate_when_unhealthy
    z_lo, z_hi = u._healthy_z_range
    f_lo, f_hi = u._contact_force_range
    skip = 2 if u._exclude_current_positions_from_observation else 0
    with_forces = u._include_cfrc_ext_in_observation
    dt = u.dt  # a property (timestep x frame skip): read once
    # mjData's arrays never move (reset writes into them), so their numpy views are taken once
    xpos, qpos, qvel, ctrl, cfrc_ext = data.xpos, data.qpos, data.qvel, data.ctrl, data.cfrc_ext
    forces = np.empty_like(cfrc_ext)

    def step(action: np.ndarray) -> tuple[np.ndarray, float, bool, bool, dict]:
        _check(action, nu)
        xy_before = xpos[body, :2].copy()
        ctrl[:] = action
        mujoco.mj_step(model, data, nstep=n_frames)
        mujoco.mj_rnePostConstraint(model, data)
        x_velocity, y_velocity = (xpos[body, :2] - xy_before) / dt
        # np.clip's semantics (NaN stays NaN) without its Python wrapper, into a buffer of this stepper
        np.minimum(np.maximum(cfrc_ext, f_lo, out=forces), f_hi, out=forces)
        parts = (qpos[skip:], qvel, forces[1:].ravel()) if with_forces else (qpos[skip:], qvel)
        obs = np.concatenate(parts)
        is_healthy = np.isfinite(qpos).all() and np.isfinite(qvel).all() and z_lo <= qpos[2] <= z_hi
        forward = x_velocity * forward_w
        survive = is_healthy * healthy_w
        ctrl_cost = ctrl_w * np.sum(np.square(action))
        contact_cost = contact_w * np.sum(np.square(forces))
        reward = (forward + survive) - (ctrl_cost + contact_cost)
        xy = qpos[0:2]
        info = {"x_position": qpos[0], "y_position": qpos[1], "distance_from_origin": np.sqrt(xy.dot(xy)),
                "x_velocity": x_velocity, "y_velocity": y_velocity, "reward_forward": forward,
                "reward_ctrl": -ctrl_cost, "reward_contact": -contact_cost, "reward_survive": survive}
        return obs, reward, (not is_healthy) and terminate, _tick(limit), info

    return step
