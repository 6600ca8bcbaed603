"""Action chunks: a policy step that emits K env actions (OpenVLA-OFT-style heads).

A policy declares ``action_chunk = K`` (> 1). An embodied world then wraps the simulator in
:class:`ChunkedSimulator`: one step of a wrapped env takes a ``[K, *action_shape]`` action and
steps the inner env up to K times *inside that env*, stopping at the first termination or
truncation, so no action of a chunk leaks into the next episode. The step returns

- the sum of the inner rewards (PPO and GRPO then see one reward per chunk; PPO's discount
  applies per chunk),
- the observation after the last inner step,
- terminated / truncated of the last inner step,
- ``info["success"]`` true if any inner step succeeded (with ``terminate_on_success`` that
  step ends the chunk anyway).

Being an ordinary env, the wrapper works everywhere envs go (worker processes, evaluation,
GRPO groups) and exact resume replays its ``[K, ...]`` actions. Episode lengths and the ``rl``
budget count policy steps (chunks), not inner env steps.

Only the chunk's last observation reaches the policy. An env that can step without building its
observation (optional ``step_unobserved(action) -> (reward, terminated, truncated, info)`` plus
``observe() -> obs``) skips the K - 1 in between: for a pixel env that is K - 1 camera renders
per chunk saved (Meta-World from pixels: docs/metaworld.md, "Speed"). The numbers are the same
either way; ``observe()`` is called only where the episode ends inside the chunk.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import numpy as np

from rlinf_cli.api import ArraySpec, EnvSpec
from rlinf_cli.errors import UserError


def chunk_of(policy: Any) -> int:
    """The number of env actions one step of ``policy`` emits (1 for ordinary policies)."""
    return int(getattr(policy, "action_chunk", 1) or 1)


def chunked_spec(spec: EnvSpec, k: int) -> EnvSpec:
    if spec.discrete:
        raise UserError("action chunks need a continuous action space; this simulator's actions are discrete")
    a = spec.action
    return dataclasses.replace(spec, action=ArraySpec((k, *a.shape), a.dtype, a.low, a.high),
                               max_episode_steps=math.ceil(spec.max_episode_steps / k))


class ChunkedEnv:
    def __init__(self, env: Any, k: int):
        self.env, self.k = env, k

    def reset(self, *, seed: int | None = None, **kw: Any) -> Any:
        return self.env.reset(seed=seed, **kw)

    def step(self, action: np.ndarray) -> tuple[Any, float, bool, bool, dict[str, Any]]:
        total, success = 0.0, False
        obs, terminated, truncated, info = None, False, False, {}
        blind = getattr(self.env, "step_unobserved", None)
        for k in range(self.k):
            if blind is not None and k < self.k - 1:
                reward, terminated, truncated, info = blind(action[k])
                if terminated or truncated:
                    obs = self.env.observe()
            else:
                obs, reward, terminated, truncated, info = self.env.step(action[k])
            total += float(reward)
            success = success or bool(info.get("success", False))
            if terminated or truncated:
                break
        info = dict(info)
        if "success" in info or success:
            info["success"] = success
        info["chunk_steps"] = k + 1
        return obs, total, terminated, truncated, info

    def close(self) -> None:
        self.env.close()

    def __getattr__(self, name: str) -> Any:  # render and other extras of the inner env
        if name == "env":
            raise AttributeError(name)
        return getattr(self.env, name)


class ChunkedSimulator:
    """``sim`` whose envs take ``[k, *action_shape]`` actions (see the module docstring)."""

    def __init__(self, sim: Any, k: int):
        if hasattr(sim, "connect_workers"):
            raise UserError("action chunks run inside each env: a hosted simulator (sim=remote) cannot be chunked yet")
        if hasattr(sim, "make_batched_env"):
            raise UserError("action chunks run inside each env: a batched simulator (one engine for all envs, e.g. "
                            "sim=isaaclab) cannot be chunked yet; use a model without action chunks")
        if k < 2:
            raise ValueError("a chunk has at least 2 actions")
        self.inner, self.k = sim, k
        self.spec = chunked_spec(sim.spec, k)

    def make_env(self, index: int) -> ChunkedEnv:
        return ChunkedEnv(self.inner.make_env(index), self.k)

    def expert(self) -> Any:
        return None  # scripted experts act one step at a time: collect demonstrations unchunked

    def with_video(self, size: int) -> Any:
        made = self.inner.with_video(size) if hasattr(self.inner, "with_video") else None
        return None if made is None else (ChunkedSimulator(made[0], self.k), made[1])

    def __getattr__(self, name: str) -> Any:  # label, fps, instructions, ...
        if name == "inner":
            raise AttributeError(name)
        return getattr(self.inner, name)


def chunk_targets(actions: np.ndarray, episode: np.ndarray, k: int) -> np.ndarray:
    """``[N, k, *shape]`` targets for behaviour cloning of chunks: row i's action and the k - 1
    that follow it in its episode (rows of an episode are consecutive, in time order), the
    episode's last action repeated past its end."""
    n = len(actions)
    last_of = np.append(np.flatnonzero(np.diff(episode) != 0), n - 1)  # index of each episode's last row
    ends = last_of[np.searchsorted(last_of, np.arange(n))]  # the last row of each row's episode
    return actions[np.minimum(np.arange(n)[:, None] + np.arange(k)[None, :], ends[:, None])]
