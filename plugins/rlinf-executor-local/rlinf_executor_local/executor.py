"""Env instances on this machine: in this process (collocated) or in worker processes.

``runtime.mode`` picks the placement (see :mod:`rlinf_cli.runtime.placement`); observations
from workers travel through shared memory when they are large and uncompressed, else pickled
(and compressed with ``env.obs_compression``) through the worker's pipe.
"""

from __future__ import annotations

from typing import Any, Mapping

from rlinf_cli.api import (Simulator, VecEnv, placement, SyncVecEnv, EnvWorkerError, RemoteError, SharedObs,
                           WorkerDied, WorkerVecEnv, hosted_vec_env, last_line, plan_layout, worker_shards)

# Below this many observation bytes per step, pickling through the pipe costs less than the
# extra copy and bookkeeping of shared memory.
SHM_MIN_BYTES = 16 * 1024


class LocalExecutor:
    def __init__(self, cfg: Mapping[str, Any]):
        self.cfg = dict(cfg)
        self.runtime = placement.runtime_config(self.cfg.get("runtime"))
        self.choice: placement.Choice | None = None
        self._placement = "local (in-process)"
        self._resolved: placement.RuntimeConfig | None = None

    def make_vec_env(self, simulator: Simulator, num_envs: int, autoreset: bool) -> VecEnv:
        if self._resolved is None:  # auto probes once; later env batches (evaluation) reuse its choice
            self._resolved, self.choice = placement.resolve(self.runtime, simulator, num_envs)
        rt = self._resolved
        hosted = hosted_vec_env(simulator, rt, num_envs, autoreset, "local")
        if hosted is not None:  # sim=remote: the envs are on env servers already
            self._placement = hosted.label
            return hosted
        if rt.mode == "collocated":
            self._placement = "local, collocated (envs stepped in this process)"
            return SyncVecEnv(simulator, range(num_envs), autoreset=autoreset)
        workers, stages, shards = plan_layout(rt, num_envs)
        shm = self._shared_memory(rt, simulator, num_envs)
        from rlinf_cli.api import start_workers

        per_worker = [worker_shards(shards, w) for w in range(workers)]
        try:
            handles = start_workers(simulator, per_worker, autoreset, rt.codec, shm.name if shm else None, num_envs,
                                    rt.start_method, rt.worker_timeout_s)
        except (RemoteError, WorkerDied) as exc:
            if shm is not None:
                shm.close()
            last = last_line(exc.args[0] if exc.args else "", type(exc).__name__)
            raise EnvWorkerError(f"an env worker failed to create its envs: {last}") from exc
        transport = "shared memory" if shm else f"pipe, obs_compression={rt.obs_compression}" + (
            "+xor-delta" if rt.obs_delta else "")
        label = (f"local, {rt.mode}: {num_envs} envs in {workers} worker process(es)"
                 + (f", {stages} pipeline stages" if rt.mode == "hybrid" else "") + f", {transport}")
        self._placement = label
        return WorkerVecEnv(simulator.spec, num_envs, autoreset, shards, handles, rt.codec, shm, rt.max_restarts, label)

    def _shared_memory(self, rt: placement.RuntimeConfig, simulator: Simulator, num_envs: int) -> SharedObs | None:
        if rt.shared_memory is False or rt.obs_compression != "none":
            return None
        if rt.shared_memory == "auto":
            import numpy as np

            nbytes = sum(int(np.prod(s.shape, dtype=np.int64)) * np.dtype(s.dtype).itemsize
                         for s in simulator.spec.observation.values() if not s.is_text) * num_envs
            if nbytes < SHM_MIN_BYTES:
                return None
        return SharedObs(simulator.spec, num_envs)

    def describe(self) -> str:
        """Where the envs run; with ``runtime.mode=auto``, what the probe chose and why first."""
        return (f"{self.choice.reason}\nruntime: " if self.choice is not None else "") + self._placement
