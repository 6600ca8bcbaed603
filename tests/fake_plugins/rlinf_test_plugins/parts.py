"""Test-only components: a simulator that declares replayable=False, an algorithm missing a key."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np

from rlinf_cli.algorithm import Algorithm
from rlinf_cli.api import ArraySpec, EnvSpec


class _Env:
    def __init__(self, horizon: int):
        self.horizon, self.t, self.seed = horizon, 0, 0

    def _obs(self) -> dict:
        return {"state": np.array([self.seed % 1000, self.t], dtype=np.float32)}

    def reset(self, *, seed=None):
        self.seed, self.t = int(seed or 0), 0
        return self._obs(), {}

    def step(self, action):
        self.t += 1
        return self._obs(), float(action == 1), self.t >= self.horizon, False, {}

    def close(self):
        pass


class NoReplaySim:
    def __init__(self, cfg: Mapping[str, Any]):
        self.horizon = int(cfg.get("horizon", 30))
        self.spec = EnvSpec({"state": ArraySpec((2,), "float32")}, ArraySpec((), "int64"), num_actions=2,
                            max_episode_steps=self.horizon, replayable=False)

    def make_env(self, index: int) -> _Env:
        return _Env(self.horizon)

    def expert(self):
        return None


@dataclass(frozen=True)
class BadConfig:  # not derived from TrainConfig, and no rollout_steps
    lr: float = 3e-4


class BadA2C(Algorithm):
    Config = BadConfig
    name = "a2c_bad"
    rollout = "steps"
