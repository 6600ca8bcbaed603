"""Tiny picklable simulators for runtime tests (no gymnasium import, microsecond steps)."""

from __future__ import annotations

import os

import numpy as np

from rlinf_cli.api import ArraySpec, EnvSpec


class _CounterEnv:
    """Obs = [index, seed, t] (+ an image that shifts one row per step); reward = action; ends at t == horizon."""

    def __init__(self, index: int, horizon: int, image: bool, fail_at: int | None, fail_how: str,
                 probe_env: str | None = None):
        self.index, self.horizon, self.image = index, horizon, image
        self.probe = float(os.environ.get(probe_env, "-1")) if probe_env else None
        self.fail_at, self.fail_how = fail_at, fail_how
        self.seed = 0
        self.t = 0
        self.steps = 0

    def _obs(self) -> dict:
        values = [self.index, self.seed, self.t] + ([self.probe] if self.probe is not None else [])
        obs = {"state": np.array(values, dtype=np.float32)}
        if self.image:
            img = np.zeros((16, 16, 3), dtype=np.uint8)
            img[self.t % 16] = 255
            img[:, self.index % 16, 0] = 100
            obs["rgb"] = img
        return obs

    def reset(self, *, seed=None):
        if seed is not None:
            self.seed = int(seed)
        else:
            self.seed += 1000
        self.t = 0
        return self._obs(), {}

    def step(self, action):
        self.steps += 1
        if self.fail_at is not None and self.steps == self.fail_at:
            if self.fail_how == "exit":
                os._exit(7)
            raise ValueError(f"simulated physics blow-up in env {self.index}")
        self.t += 1
        return self._obs(), float(action), self.t >= self.horizon and self.index % 2 == 0, \
            self.t >= self.horizon and self.index % 2 == 1, {"success": self.t == 3}

    def close(self):
        pass


class CounterSim:
    """Deterministic: envs with even index terminate, odd ones truncate, at ``horizon``."""

    def __init__(self, horizon: int = 5, image: bool = False, fail_env: int | None = None, fail_at: int | None = None,
                 fail_how: str = "exit", probe_env: str | None = None):
        obs = {"state": ArraySpec((4 if probe_env else 3,), "float32")}
        if image:
            obs["rgb"] = ArraySpec((16, 16, 3), "uint8", 0, 255)
        self.spec = EnvSpec(obs, ArraySpec((), "int64"), num_actions=3, max_episode_steps=horizon, has_success=True)
        self.horizon, self.image = horizon, image
        self.fail_env, self.fail_at, self.fail_how = fail_env, fail_at, fail_how
        self.probe_env = probe_env  # an env var each env reads at creation (obs state[3])

    def make_env(self, index: int) -> _CounterEnv:
        fail = self.fail_at if index == self.fail_env else None
        return _CounterEnv(index, self.horizon, self.image, fail, self.fail_how, self.probe_env)

    def expert(self):
        return None
