"""A vectorised env over a slice of env instances, stepped in this process.

Executors build on it: the local executor uses it directly (collocated) or inside worker
processes; the Ray executor inside actors. Observations are written into preallocated arrays,
so a step costs one Python call per env and no dict rebuilding.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from rlinf_cli.api import EnvSpec, Obs, Simulator, StepBatch


def alloc_obs(spec: EnvSpec, n: int) -> Obs:
    return {k: np.zeros((n, *s.shape), dtype=s.dtype) for k, s in spec.observation.items()}


def write_obs(dst: Obs, i: int, obs: Obs) -> None:
    for k, buf in dst.items():
        buf[i] = obs[k]


class SyncVecEnv:
    """Steps ``len(indices)`` env instances one after another in this process."""

    def __init__(self, simulator: Simulator, indices: Sequence[int], autoreset: bool = True):
        self.spec: EnvSpec = simulator.spec
        self.indices = list(indices)
        self.num_envs = len(self.indices)
        self.autoreset = autoreset
        self.envs = [simulator.make_env(i) for i in self.indices]
        self._obs = alloc_obs(self.spec, self.num_envs)
        self._done = np.zeros(self.num_envs, dtype=bool)

    def reset(self, seeds: Sequence[int | None]) -> Obs:
        if len(seeds) != self.num_envs:
            raise ValueError(f"reset needs {self.num_envs} seeds, got {len(seeds)}")
        for i, (env, seed) in enumerate(zip(self.envs, seeds)):
            obs, _ = env.reset(seed=None if seed is None else int(seed))
            write_obs(self._obs, i, obs)
        self._done[:] = False
        return {k: v.copy() for k, v in self._obs.items()}

    def step(self, actions: np.ndarray) -> StepBatch:
        n = self.num_envs
        reward = np.zeros(n, dtype=np.float32)
        terminated = np.zeros(n, dtype=bool)
        truncated = np.zeros(n, dtype=bool)
        success = np.zeros(n, dtype=bool)
        final_obs: Obs | None = None
        for i, env in enumerate(self.envs):
            if self._done[i]:  # autoreset=False: a finished env waits for reset()
                continue
            obs, r, term, trunc, info = env.step(actions[i])
            reward[i] = r
            terminated[i] = term
            truncated[i] = trunc
            success[i] = bool(info.get("success", False))
            if term or trunc:
                if self.autoreset:
                    if final_obs is None:
                        final_obs = alloc_obs(self.spec, n)
                    write_obs(final_obs, i, obs)
                    obs, _ = env.reset()
                else:
                    self._done[i] = True
            write_obs(self._obs, i, obs)
        return StepBatch({k: v.copy() for k, v in self._obs.items()}, reward, terminated, truncated, success, final_obs)

    def close(self) -> None:
        for env in self.envs:
            env.close()
