"""Run in .venv-isaaclab by tests/sims/test_isaaclab.py: the API signature of the real Isaac Lab env and of
tests/fake_isaaclab.py's fake, side by side, as JSON on the last line of stdout.

usage: python isaaclab_signature.py TASK NUM_ENVS HORIZON
"""

from __future__ import annotations

import json
import sys
from typing import Any

import torch


def describe(x: Any) -> Any:
    if isinstance(x, torch.Tensor):
        return {"tensor": str(x.dtype), "shape": list(x.shape), "device": x.device.type}
    if isinstance(x, dict):
        return {k: describe(v) for k, v in sorted(x.items()) if k != "log"} | ({"log": "dict"} if "log" in x else {})
    return type(x).__name__


def signature(env: Any, steps: int, act_dim: int) -> dict[str, Any]:
    u = env.unwrapped
    out: dict[str, Any] = {"num_envs": int(u.num_envs), "device": str(u.device),
                           "observation_groups": sorted(u.single_observation_space.spaces),
                           "action_shape": list(u.single_action_space.shape)}
    reset = env.reset(seed=5)
    out["reset"] = [describe(x) for x in reset] if isinstance(reset, tuple) else describe(reset)
    n = u.num_envs
    first_end: dict[str, Any] = {}
    both = 0
    for t in range(1, steps + 1):
        ret = env.step(torch.zeros((n, act_dim), device=u.device))
        obs, reward, term, tout, extras = ret
        if t == 1:
            out["step"] = [describe(x) for x in ret]
        both += int((term & tout).sum())
        if (term | tout).any() and not first_end:
            done = (term | tout)
            first_end = {"step": t, "kind": "time_out" if tout.any() else "terminated",
                         "final_obs": describe(extras.get("final_obs")) if "final_obs" in extras else None,
                         "length_after_reset": int(u.episode_length_buf[done].max())}
    out["first_end"] = first_end
    out["terminated_and_time_out_at_once"] = both
    return out


def main() -> None:
    task, n, horizon = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    import gymnasium as gym
    import isaaclab_tasks  # noqa: F401
    from isaaclab_tasks.utils import parse_env_cfg

    torch.set_num_threads(1)
    cfg = parse_env_cfg(task, device="cpu", num_envs=n)
    cfg.compute_final_obs = True
    cfg.episode_length_s = horizon * cfg.sim.dt * cfg.decimation  # a short time limit: time-outs come soon
    cfg.initial_pole_angle_range = (0.0, 0.0)  # upright and still: only the time limit ends these episodes
    cfg.initial_pole_velocity_range = (0.0, 0.0)
    cfg.initial_cart_velocity_range = (0.0, 0.0)
    env = gym.make(task, cfg=cfg)
    real = signature(env, horizon + 2, env.unwrapped.single_action_space.shape[0])
    real["max_episode_length"] = int(env.unwrapped.max_episode_length)
    env.close()

    from fake_isaaclab import FakeIsaacLabEnv

    fake_env = FakeIsaacLabEnv(n, max_episode_length=horizon, max_angle=10.0, compute_final_obs=True)
    fake = signature(fake_env, horizon + 2, 1)
    fake["max_episode_length"] = fake_env.max_episode_length
    print(json.dumps({"real": real, "fake": fake}))


if __name__ == "__main__":
    main()
