"""The worker side of env workers: what a worker process (or Ray actor, or env-server session)
hosts. :class:`EnvWorker` steps its shards' envs and answers each request with a :class:`Reply`;
numeric observations may go through :class:`SharedObs` instead of the reply.

The driver side (handles, the batch a policy sees, crash recovery) is :mod:`rlinf_cli.runtime.workers`;
nothing here imports it, so a worker process loads only what it runs.
"""

from __future__ import annotations

import time
from typing import NamedTuple, Sequence

import numpy as np

from rlinf_cli.api import EnvSpec, Obs, Simulator
from rlinf_cli.runtime.codec import CodecConfig, ObsEncoder, Packed


class Reply(NamedTuple):
    """What a worker returns for one shard request (small; observations may travel apart)."""

    obs: dict[str, Packed] | None  # None: written into shared memory
    reward: np.ndarray | None
    terminated: np.ndarray | None
    truncated: np.ndarray | None
    success: np.ndarray | None
    final_obs: Obs | None
    stats: dict[str, float]


class SharedObs:
    """Observation arrays [num_envs, ...] in one shared-memory block, written by the workers.

    The driver creates it (``create=True``) and unlinks it on close; workers attach by name.
    """

    def __init__(self, spec: EnvSpec, num_envs: int, name: str | None = None):
        from multiprocessing import shared_memory

        layout, offset = [], 0
        for key, s in spec.observation.items():
            if s.is_text:  # strings cannot live in shared memory: they travel with the reply
                continue
            nbytes = int(np.prod((num_envs, *s.shape), dtype=np.int64)) * np.dtype(s.dtype).itemsize
            layout.append((key, (num_envs, *s.shape), s.dtype, offset))
            offset += (nbytes + 63) // 64 * 64
        self.owner = name is None
        if self.owner:
            self.shm = shared_memory.SharedMemory(create=True, size=max(offset, 1))
        else:
            # Attaching must not register the block with this process's resource tracker: the
            # tracker would unlink it (and warn) when this worker exits, under the driver's feet.
            from multiprocessing import resource_tracker

            register = resource_tracker.register
            resource_tracker.register = lambda *a, **k: None  # type: ignore[assignment]
            try:
                self.shm = shared_memory.SharedMemory(name=name)
            finally:
                resource_tracker.register = register  # type: ignore[assignment]
        self.name = self.shm.name
        self.arrays = {key: np.ndarray(shape, dtype=dtype, buffer=self.shm.buf, offset=off)
                       for key, shape, dtype, off in layout}

    def close(self) -> None:
        self.arrays = {}
        try:
            self.shm.close()
            if self.owner:
                self.shm.unlink()
        except (FileNotFoundError, BufferError):
            pass


class EnvWorker:
    """The object a worker hosts: one VecEnv and one codec stream per shard (a
    :class:`SyncVecEnv` of single envs, or one batch of a batched simulator's engine)."""

    def __init__(self, simulator: Simulator, shards: Sequence[tuple[int, int]], autoreset: bool,
                 codec: CodecConfig, shm_name: str | None = None, num_envs: int = 0):
        self.shards = [tuple(s) for s in shards]
        from rlinf_cli.runtime.batched import shard_vec_env

        self.envs = [shard_vec_env(simulator, range(lo, hi), autoreset) for lo, hi in self.shards]
        self.encoders = [ObsEncoder(codec) for _ in self.shards]
        self.shm = SharedObs(simulator.spec, num_envs, shm_name) if shm_name else None

    def _emit(self, i: int, obs: Obs, keyframe: bool) -> tuple[dict[str, Packed] | None, dict[str, float]]:
        if self.shm is not None:
            lo, hi = self.shards[i]
            for key, arr in self.shm.arrays.items():
                arr[lo:hi] = obs[key]
            nbytes = float(sum(obs[key].nbytes for key in self.shm.arrays))
            stats = {"transport/obs_bytes_raw": nbytes, "transport/obs_bytes": nbytes}
            text = {k: v for k, v in obs.items() if k not in self.shm.arrays}
            if not text:
                return None, stats
            packed, more = self.encoders[i].encode(text, keyframe)
            return packed, {k: stats.get(k, 0.0) + v for k, v in more.items()}
        return self.encoders[i].encode(obs, keyframe)

    def reset(self, i: int, seeds: Sequence[int | None]) -> Reply:
        return self.restore(i, seeds, [0] * len(seeds), None)

    def restore(self, i: int, streams: Sequence[int | None], episodes: Sequence[int],
                actions: Sequence[np.ndarray] | None) -> Reply:
        obs = self.envs[i].restore(streams, episodes, actions)
        packed, stats = self._emit(i, obs, keyframe=True)
        return Reply(packed, None, None, None, None, None, stats)

    def step(self, i: int, actions: np.ndarray) -> Reply:
        t0 = time.perf_counter()
        sb = self.envs[i].step(actions)
        t_sim = time.perf_counter() - t0
        packed, stats = self._emit(i, sb.obs, keyframe=False)
        stats["runtime/sim_s"] = t_sim
        return Reply(packed, sb.reward, sb.terminated, sb.truncated, sb.success, sb.final_obs, stats)

    def park(self, i: int) -> None:
        """Mark shard ``i``'s envs finished (non-autoreset envs replaced after a crash)."""
        self.envs[i]._done[:] = True

    def ping(self) -> int:
        import os

        return os.getpid()

    def close(self) -> None:
        for env in self.envs:
            env.close()
        if self.shm is not None:
            self.shm.close()
