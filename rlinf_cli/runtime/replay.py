"""The replay buffer of ``transitions`` rollouts (off-policy algorithms): a numpy ring buffer.

Each entry is one env step: the observation entries the policy reads (each in its own dtype:
images stay uint8), the action in the env's units, the raw reward, the next observation (the
final one where an episode ended and the env auto-reset) and ``terminated`` (time-limit
truncation is not termination: the critic bootstraps through it). Observations and rewards are
stored raw: a run that normalizes applies its current statistics when it samples, so old and
new transitions are read on one scale, and demonstrations (raw by nature) mix in on equal terms.

Memory is bounded by ``capacity`` and allocated up front, so a buffer that does not fit is
refused at start, not hours in. The filled part is saved with every checkpoint (``state``), so a
resumed run samples exactly what the uninterrupted one would have.
"""

from __future__ import annotations

import math
from typing import Any, Mapping, Sequence

import numpy as np
import torch

from rlinf_cli.api import EnvSpec, Obs
from rlinf_cli.errors import UserError


def available_memory() -> int | None:
    """Bytes of memory available to allocate (Linux ``MemAvailable``), or None if unknown."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


class ReplayBuffer:
    """Ring buffer of ``capacity`` transitions for the observation entries ``keys``."""

    def __init__(self, spec: EnvSpec, keys: Sequence[str], capacity: int, what: str = "replay buffer"):
        if capacity < 1:
            raise UserError(f"the {what} needs a capacity >= 1, got {capacity}")
        text = [k for k in keys if spec.observation[k].is_text]
        if text:
            raise UserError(f"the {what} stores numeric observations; the policy reads text entries {text}")
        self.spec, self.keys, self.capacity = spec, list(keys), int(capacity)
        act_dtype = np.int64 if spec.discrete else np.float32
        per = sum(2 * math.prod(spec.observation[k].shape) * np.dtype(spec.observation[k].dtype).itemsize for k in keys)
        per += math.prod(spec.action.shape) * np.dtype(act_dtype).itemsize + 4 + 1
        self.nbytes = per * self.capacity
        free = available_memory()
        if free is not None and self.nbytes > 0.8 * free:
            raise UserError(f"the {what} would take {self.nbytes / 2**30:.1f} GiB ({capacity:,} transitions x "
                            f"{per:,} bytes) but {free / 2**30:.1f} GiB is available; lower its size (algo.buffer_size)")
        self.obs = {k: np.zeros((self.capacity, *spec.observation[k].shape), spec.observation[k].dtype) for k in keys}
        self.next_obs = {k: np.zeros_like(v) for k, v in self.obs.items()}
        self.actions = np.zeros((self.capacity, *spec.action.shape), act_dtype)
        self.rewards = np.zeros(self.capacity, np.float32)
        self.terminated = np.zeros(self.capacity, bool)
        self.pos = 0  # next slot to write
        self.size = 0  # filled slots
        self.added = 0  # transitions ever added (the oldest are overwritten past capacity)

    def __len__(self) -> int:
        return self.size

    def add(self, obs: Obs, actions: np.ndarray, rewards: np.ndarray, next_obs: Obs, terminated: np.ndarray) -> None:
        """Append a batch of transitions (leading dim = envs), overwriting the oldest when full."""
        n = len(rewards)
        idx = (self.pos + np.arange(n)) % self.capacity
        for k in self.keys:
            self.obs[k][idx] = obs[k]
            self.next_obs[k][idx] = next_obs[k]
        self.actions[idx] = actions
        self.rewards[idx] = rewards
        self.terminated[idx] = terminated
        self.pos = int((self.pos + n) % self.capacity)
        self.size = min(self.size + n, self.capacity)
        self.added += n

    def sample(self, n: int, generator: torch.Generator) -> dict[str, Any]:
        """``n`` transitions drawn uniformly (with replacement) by ``generator``, as numpy arrays."""
        idx = torch.randint(self.size, (n,), generator=generator).numpy()
        return {"obs": {k: v[idx] for k, v in self.obs.items()}, "next_obs": {k: v[idx] for k, v in self.next_obs.items()},
                "actions": self.actions[idx], "rewards": self.rewards[idx], "terminated": self.terminated[idx]}

    # -- checkpoints ---------------------------------------------------------------------------
    def state(self, prefix: str = "replay.") -> dict[str, np.ndarray]:
        """The filled part and the ring position, as arrays for a checkpoint."""
        s = self.size
        out = {f"{prefix}obs.{k}": v[:s] for k, v in self.obs.items()}
        out.update({f"{prefix}next_obs.{k}": v[:s] for k, v in self.next_obs.items()})
        out.update({f"{prefix}actions": self.actions[:s], f"{prefix}rewards": self.rewards[:s],
                    f"{prefix}terminated": self.terminated[:s].astype(np.uint8),
                    f"{prefix}meta": np.array([self.pos, self.size, self.added, self.capacity], np.int64)})
        return out

    def load(self, state: Mapping[str, np.ndarray], prefix: str = "replay.") -> bool:
        """Restore :meth:`state`; False if ``state`` holds no buffer (a checkpoint from elsewhere)."""
        if f"{prefix}meta" not in state:
            return False
        pos, size, added, capacity = (int(x) for x in state[f"{prefix}meta"])
        if capacity != self.capacity:
            raise UserError(f"the checkpoint's replay buffer holds {capacity:,} transitions, this run's "
                            f"{self.capacity:,}: resume with the same algo.buffer_size")
        for k in self.keys:
            self.obs[k][:size] = state[f"{prefix}obs.{k}"]
            self.next_obs[k][:size] = state[f"{prefix}next_obs.{k}"]
        self.actions[:size] = state[f"{prefix}actions"]
        self.rewards[:size] = state[f"{prefix}rewards"]
        self.terminated[:size] = state[f"{prefix}terminated"].astype(bool)
        self.pos, self.size, self.added = pos, size, added
        return True
