"""A tiny simulator showing rlinf's contract: replace LineEnv with your own environment.

Contract (rlinf_cli.api): ``Simulator(cfg)`` has ``spec`` (an EnvSpec) and ``make_env(index)``;
``expert()`` returns a scripted policy or None. Envs return dict observations and take
``reset(seed=)`` so that the same seed gives the same episode. The Simulator object must be
picklable: executors ship it to worker processes.
"""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np

from rlinf_cli.api import ArraySpec, EnvSpec


class LineEnv:
    """Observation: [position, target]; actions: 0 left, 1 stay, 2 right; success at the target."""

    def __init__(self, size: int, max_steps: int):
        self.size, self.max_steps = size, max_steps
        self.rng = np.random.default_rng()
        self.pos = self.target = self.t = 0

    def _obs(self) -> dict[str, np.ndarray]:
        return {"state": np.array([self.pos, self.target], dtype=np.float32) / self.size}

    def reset(self, *, seed: int | None = None) -> tuple[dict[str, np.ndarray], dict]:
        if seed is not None:
            self.rng = np.random.default_rng(seed)
        self.pos, self.target = (int(x) for x in self.rng.integers(0, self.size, size=2))
        self.t = 0
        return self._obs(), {}

    def step(self, action: Any) -> tuple[dict[str, np.ndarray], float, bool, bool, dict]:
        self.pos = int(np.clip(self.pos + int(action) - 1, 0, self.size - 1))
        self.t += 1
        success = self.pos == self.target
        return self._obs(), float(success), success, self.t >= self.max_steps, {"success": success}

    def close(self) -> None:
        pass


class Simulator:
    def __init__(self, cfg: Mapping[str, Any]):
        self.size = int(cfg.get("size", 10))
        self.max_steps = int(cfg.get("max_episode_steps", 30))
        self.spec = EnvSpec(
            observation={"state": ArraySpec((2,), "float32")},
            action=ArraySpec((), "int64"),
            num_actions=3,
            max_episode_steps=self.max_steps,
            has_success=True,
        )

    def make_env(self, index: int) -> LineEnv:
        return LineEnv(self.size, self.max_steps)

    def expert(self):
        def act(obs: dict[str, np.ndarray], index: int) -> np.ndarray:
            pos, target = obs["state"]
            return np.asarray(1 + int(np.sign(target - pos)), dtype=np.int64)

        return act
