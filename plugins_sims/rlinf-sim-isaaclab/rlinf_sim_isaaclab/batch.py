"""One Isaac Lab env (all its envs) as a :class:`~rlinf_cli.api.BatchedEnv`.

It speaks Isaac Lab's own API, which the unit tests' fake reproduces (tests/fake_isaaclab.py):
``reset(seed=s) -> (obs, extras)`` and ``step(actions) -> (obs, reward, terminated, time_outs,
extras)`` with batched torch tensors, observations as ``{"policy": tensor, ...}`` (a group may be
a dict of terms), ``extras["final_obs"]`` when ``compute_final_obs`` is on.
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator, Mapping, Sequence

import numpy as np
import torch

from rlinf_sim_isaaclab.sim import flatten_obs


class IsaacLabBatch:
    def __init__(self, env: Any, state_group: str = "policy", success: str = "none", action_bound: float = 1.0):
        self.env = env
        self.unwrapped = getattr(env, "unwrapped", env)
        self.num_envs = int(self.unwrapped.num_envs)
        self.device = torch.device(self.unwrapped.device)
        self.state_group = state_group
        self.success = success
        self.action_bound = float(action_bound)
        self._rng: torch.Tensor | None = None  # the engine's own torch stream (see _own_rng)
        # Isaac Lab's first reset reports the joint velocities of before the reset (its data
        # buffers refresh on the first physics step): a throw-away reset makes every seeded reset
        # alike, so the same seed gives the same first observation
        self._seeded_reset(0)

    @contextlib.contextmanager
    def _own_rng(self) -> Iterator[None]:
        """Isaac Lab draws its resets from torch's global generator, which its reset(seed) seeds.
        The engine gets a stream of its own, swapped in around each call: its episodes are a
        function of the seed and the actions (in any process), and an in-process trainer's
        sampling is neither reseeded nor consumed by the engine."""
        caller = torch.random.get_rng_state()
        if self._rng is not None:
            torch.random.set_rng_state(self._rng)
        try:
            yield
        finally:
            self._rng = torch.random.get_rng_state()
            torch.random.set_rng_state(caller)

    def _seeded_reset(self, seed: int | None) -> Mapping[str, Any]:
        with self._own_rng():
            obs, _ = self.env.reset(seed=seed)
        return obs

    def reset(self, seeds: Sequence[int | None]) -> dict[str, Any]:
        # one seed for the whole batch (EnvSpec.per_env_seeds=False): the first one
        seed = seeds[0] if len(seeds) else None
        return flatten_obs(self._seeded_reset(None if seed is None else int(seed) % 2**31), self.state_group)

    def step(self, actions: np.ndarray) -> tuple[dict[str, Any], Any, Any, Any, dict[str, Any]]:
        a = torch.from_numpy(np.array(actions, dtype=np.float32)).to(self.device)  # a copy: the caller keeps its array
        if a.ndim == 1:
            a = a.unsqueeze(-1)
        if self.action_bound:
            a = a.clamp(-self.action_bound, self.action_bound)
        with self._own_rng():
            obs, reward, terminated, time_outs, extras = self.env.step(a)
        terminated = terminated.bool()
        truncated = time_outs.bool() & ~terminated
        info: dict[str, Any] = {}
        if self.success == "time_out":  # survived to the time limit (Isaac Lab's cart-pole metric)
            info["success"] = truncated
        elif self.success == "terminated":  # reached the goal that ends the episode
            info["success"] = terminated
        final = extras.get("final_obs") if isinstance(extras, Mapping) else None
        if final is not None:
            info["final_obs"] = flatten_obs(final, self.state_group)
        return flatten_obs(obs, self.state_group), reward, terminated, truncated, info

    def close(self) -> None:
        self.env.close()
