"""gymnasium environments behind rlinf's simulator contract.

Observations become a dict (``state`` for a flat Box space, the space's own keys for a Dict
space) of float32 arrays. ``info["success"]`` is passed through where the env sets it.
MuJoCo envs can also give camera images (``obs=rgb`` or ``state_rgb``), rendered offscreen
on the CPU (see :mod:`rlinf_sim_gymnasium.pixels`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

import numpy as np

from rlinf_cli.api import settings, ArraySpec, EnvSpec, Obs, UserError


@dataclass(frozen=True)
class GymnasiumConfig:
    env_id: str = "CartPole-v1"  # gymnasium id
    max_episode_steps: int | None = None  # null = the env's registered limit
    kwargs: dict = field(default_factory=dict)  # extra keyword arguments for gymnasium.make
    reward_scale: float = 1.0  # rewards are multiplied by this
    has_success: bool = False  # the env reports info["success"] (most gymnasium envs do not)
    obs: str = "state"  # state | rgb | state_rgb: MuJoCo envs add an offscreen camera image "rgb"
    image_size: int = 84  # rgb: image height and width in pixels
    camera: str | int | None = None  # rgb: camera name or id in the MuJoCo model; null = the env's default view
    fast_step: bool = True  # Hopper/Walker2d/HalfCheetah/Ant-v5: the same step with less Python (fast.py)

    def __post_init__(self) -> None:
        if self.obs not in ("state", "rgb", "state_rgb"):
            raise ValueError(f"obs must be state, rgb or state_rgb, got '{self.obs}'")
        if not 8 <= self.image_size <= 1024:
            raise ValueError(f"image_size must be within 8..1024, got {self.image_size}")


class _DictObsEnv:
    """Wraps one gymnasium env: dict float32 observations, scaled rewards."""

    def __init__(self, env: Any, key: str | None, reward_scale: float, fast: bool = False):
        self.env = env
        self.key = key
        self.reward_scale = reward_scale
        self._step = env.step
        if fast:
            from rlinf_sim_gymnasium.fast import fast_step

            self._step = fast_step(env) or env.step

    def _obs(self, obs: Any) -> Obs:
        if self.key is not None:
            return {self.key: np.asarray(obs, dtype=np.float32)}
        return {k: np.asarray(v) for k, v in obs.items()}

    def reset(self, *, seed: int | None = None) -> tuple[Obs, dict]:
        obs, info = self.env.reset(seed=seed)
        return self._obs(obs), info

    def step(self, action: np.ndarray) -> tuple[Obs, float, bool, bool, dict]:
        obs, reward, terminated, truncated, info = self._step(action)
        return self._obs(obs), float(reward) * self.reward_scale, bool(terminated), bool(truncated), info

    def close(self) -> None:
        self.env.close()


def _cartpole_expert(obs: Obs, index: int) -> np.ndarray:
    """A linear controller on pole angle, angular velocity and cart motion: 500/500 on CartPole-v1."""
    x, x_dot, theta, theta_dot = obs["state"]
    return np.asarray(int(theta + 0.3 * theta_dot + 0.05 * x + 0.2 * x_dot > 0), dtype=np.int64)


_EXPERTS: dict[str, Callable[[Obs, int], np.ndarray]] = {"CartPole-v1": _cartpole_expert}


class GymnasiumSimulator:
    def __init__(self, cfg: Mapping[str, Any]):
        self.cfg = settings.build(GymnasiumConfig, cfg, "sim")
        if self.cfg.obs != "state":
            from rlinf_mujoco_gl import prepare_mujoco_gl

            prepare_mujoco_gl()  # before MuJoCo is first imported: it picks its GL backend then
        self.label = f"gymnasium/{self.cfg.env_id}"  # for titles and tables
        env = self._make()
        try:
            self.spec = self._spec(env)
        finally:
            env.close()
        # env.normalize_*=auto: on for state-based continuous control (MuJoCo locomotion,
        # Pendulum, MountainCarContinuous), where unnormalized observations and rewards of very
        # different scales are what keep PPO below Stable-Baselines3 with VecNormalize; never for
        # discrete actions or camera images
        self.normalize_default = (not self.spec.discrete and self.cfg.obs == "state"
                                  and all(s.dtype.startswith("float") for s in self.spec.observation.values()))

    def _make(self) -> Any:
        import gymnasium as gym

        kwargs = dict(self.cfg.kwargs)
        if self.cfg.max_episode_steps is not None:
            kwargs["max_episode_steps"] = self.cfg.max_episode_steps
        try:
            return gym.make(self.cfg.env_id, disable_env_checker=True, **kwargs)
        except gym.error.Error as exc:
            raise UserError(f"sim.env_id '{self.cfg.env_id}': {exc}") from exc
        except ImportError as exc:
            raise UserError(f"sim.env_id '{self.cfg.env_id}' needs a missing package: {exc}") from exc

    def _spec(self, env: Any) -> EnvSpec:
        from gymnasium import spaces

        space = env.observation_space
        if isinstance(space, spaces.Dict):
            obs = {k: ArraySpec(tuple(s.shape), str(s.dtype)) for k, s in space.spaces.items()}
            self._key = None
        elif isinstance(space, spaces.Box):
            obs = {"state": ArraySpec(tuple(space.shape), "float32")}
            self._key = "state"
        else:
            raise UserError(f"sim.env_id '{self.cfg.env_id}': observation space {space} is not supported (Box or Dict)")
        if self.cfg.obs != "state":
            from rlinf_sim_gymnasium.pixels import check_mujoco, image_spec

            check_mujoco(env, self.cfg.env_id)
            if self.cfg.obs == "rgb":
                obs = {}
            obs["rgb"] = image_spec(self.cfg.image_size)
        act = env.action_space
        limit = env.spec.max_episode_steps if env.spec is not None and env.spec.max_episode_steps else 1000
        if isinstance(act, spaces.Discrete):
            return EnvSpec(obs, ArraySpec((), "int64"), num_actions=int(act.n), max_episode_steps=limit,
                           has_success=self.cfg.has_success)
        if isinstance(act, spaces.Box):
            low, high = float(np.min(act.low)), float(np.max(act.high))
            return EnvSpec(obs, ArraySpec(tuple(act.shape), "float32", low, high), max_episode_steps=limit,
                           has_success=self.cfg.has_success)
        raise UserError(f"sim.env_id '{self.cfg.env_id}': action space {act} is not supported (Discrete or Box)")

    def make_env(self, index: int) -> Any:
        env = _DictObsEnv(self._make(), self._key, self.cfg.reward_scale, self.cfg.fast_step)
        if self.cfg.obs == "state":
            return env
        from rlinf_sim_gymnasium.pixels import PixelEnv

        return PixelEnv(env, self.cfg.image_size, self.cfg.camera, keep_state=self.cfg.obs == "state_rgb")

    def with_video(self, size: int) -> tuple["GymnasiumSimulator", str] | None:
        """For evaluation videos: a state env of MuJoCo also rendered at ``size`` (key ``rgb``, which
        a state policy does not read). None where the env has a camera image already or no camera."""
        if self.cfg.obs != "state":
            return None
        from dataclasses import asdict

        try:
            return GymnasiumSimulator({**asdict(self.cfg), "obs": "state_rgb", "image_size": int(size)}), "rgb"
        except UserError:  # not a MuJoCo env: nothing to render
            return None

    def expert(self) -> Callable[[Obs, int], np.ndarray] | None:
        return _EXPERTS.get(self.cfg.env_id) if self.cfg.obs != "rgb" else None
