"""The core hosts envs before it calls an executor.

:class:`WorkerExecutor` is what an executor plugin subclasses. Its ``make_vec_env`` (the
:class:`~rlinf_cli.api.Executor` contract) is the core's: it resolves ``runtime.mode``, runs the
envs of simulators that bring their own (:func:`hosted_vec_env`: a batched engine in this
process, or sessions on env servers), steps ``collocated`` envs in this process where the executor
allows it, plans the shards (:func:`~rlinf_cli.runtime.placement.plan_layout`) and the shared
memory, and wraps the workers in a :class:`~rlinf_cli.runtime.workers.WorkerVecEnv`. An executor
does one thing: start the workers of a :class:`WorkerPlan` where it places them (processes, Ray
actors, ...) and return one :class:`~rlinf_cli.runtime.workers.WorkerHandle` each.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Mapping

from rlinf_cli.api import Simulator, VecEnv
from rlinf_cli.runtime.env_worker import SharedObs
from rlinf_cli.runtime.placement import RuntimeConfig, plan_layout, plan_shards, resolve, runtime_config, worker_shards
from rlinf_cli.runtime.workers import EnvWorkerError, RemoteError, WorkerDied, WorkerHandle, WorkerVecEnv, last_line

# Below this many observation bytes per step, pickling through a pipe costs less than the extra
# copy and bookkeeping of shared memory.
SHM_MIN_BYTES = 16 * 1024


@dataclass(frozen=True)
class WorkerPlan:
    """The workers the core asks an executor to start: worker ``w`` hosts
    ``EnvWorker(*plan.worker_args(w))`` (:class:`~rlinf_cli.runtime.env_worker.EnvWorker`), the
    envs of ``shards[w]``; ``runtime`` is the resolved placement (codec, timeouts, start method)."""

    simulator: Simulator
    shards: tuple[tuple[tuple[int, int], ...], ...]  # per worker: its (lo, hi) env ranges
    num_envs: int
    autoreset: bool
    stages: int  # pipeline groups (hybrid mode); 1 = all envs stepped together
    runtime: RuntimeConfig
    shm_name: str | None = None  # the shared-memory block observations go to (same-machine workers)

    @property
    def num_workers(self) -> int:
        return len(self.shards)

    @property
    def timeout_s(self) -> float:
        return self.runtime.worker_timeout_s

    def worker_args(self, w: int) -> tuple:
        return (self.simulator, list(self.shards[w]), self.autoreset, self.runtime.codec, self.shm_name, self.num_envs)


class WorkerExecutor:
    """Base of executor plugins: the core places the envs, the subclass starts workers.

    Override :meth:`start_workers` (and :meth:`label`); set the class attributes to say what the
    workers can do. ``self.runtime`` is the ``runtime`` entry of the executor's config, ``self.cfg``
    the rest.
    """

    name = "workers"  # how placement notes name this executor
    in_process = True  # runtime.mode=collocated steps the envs in this process
    shared_memory = False  # workers run on this machine and can read its shared memory
    worker_noun = "an env worker"  # for "<noun> failed to create its envs"
    hosted_note = ""  # the executor part of a hosted simulator's placement note (default: name)
    collocated_note = ""  # added to an auto choice of collocated when in_process is False

    def __init__(self, cfg: Mapping[str, Any]):
        data = dict(cfg)
        self.runtime = runtime_config(data.pop("runtime", None))
        self.cfg: Any = data
        self.choice: Any = None  # what runtime.mode=auto chose and why (placement.Choice)
        self._resolved: RuntimeConfig | None = None
        self._placement = f"{self.name} (not started)"

    # -- what a subclass provides ------------------------------------------------------------
    def start_workers(self, plan: WorkerPlan) -> list[WorkerHandle]:
        """Start ``plan.num_workers`` workers and return their handles, each ready to serve (raise
        :class:`~rlinf_cli.runtime.workers.RemoteError` or ``WorkerDied`` if one cannot start,
        leaving none running)."""
        raise NotImplementedError

    def label(self, plan: WorkerPlan) -> str:
        """One line saying where ``plan``'s envs run (``describe()`` shows it)."""
        return f"{self.name}, {plan.runtime.mode}: {plan.num_envs} envs in {plan.num_workers} worker(s)"

    # -- the core's part -------------------------------------------------------------------
    def make_vec_env(self, simulator: Simulator, num_envs: int, autoreset: bool) -> VecEnv:
        if self._resolved is None:  # auto probes once; later env batches (evaluation) reuse its choice
            self._resolved, self.choice = resolve(self.runtime, simulator, num_envs)
            if self.choice is not None and self.choice.mode == "collocated" and not self.in_process:
                self.choice = replace(self.choice, reason=self.choice.reason + self.collocated_note)
        rt = self._resolved
        hosted = hosted_vec_env(simulator, rt, num_envs, autoreset, self.hosted_note or self.name)
        if hosted is not None:  # a batched engine here, or envs on env servers already
            self._placement = hosted.label
            return hosted
        if rt.mode == "collocated" and self.in_process:
            from rlinf_cli.runtime.vector import SyncVecEnv

            self._placement = f"{self.name}, collocated (envs stepped in this process)"
            return SyncVecEnv(simulator, range(num_envs), autoreset=autoreset)
        workers, stages, shards = plan_layout(rt, num_envs)
        shm = self._shared_memory(rt, simulator, num_envs)
        plan = WorkerPlan(simulator, tuple(tuple(worker_shards(shards, w)) for w in range(workers)), num_envs,
                          autoreset, stages, rt, shm.name if shm else None)
        try:
            handles = self.start_workers(plan)
        except (RemoteError, WorkerDied) as exc:
            if shm is not None:
                shm.close()
            last = last_line(exc.args[0] if exc.args else "", type(exc).__name__)
            raise EnvWorkerError(f"{self.worker_noun} failed to create its envs: {last}") from exc
        label = self.label(plan)
        self._placement = label
        return WorkerVecEnv(simulator.spec, num_envs, autoreset, shards, handles, rt.codec, shm, rt.max_restarts, label)

    def _shared_memory(self, rt: RuntimeConfig, simulator: Simulator, num_envs: int) -> SharedObs | None:
        if not self.shared_memory or rt.shared_memory is False or rt.obs_compression != "none":
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


def hosted_vec_env(simulator: Any, rt: RuntimeConfig, num_envs: int, autoreset: bool, executor: str) -> Any:
    """The vec env of a simulator that brings its own envs; None for others (the executor
    places single envs itself).

    :meth:`WorkerExecutor.make_vec_env` calls this before it asks the executor for anything. Two kinds of simulators bring their own:

    - a :class:`~rlinf_cli.api.BatchedSimulator` (Isaac Lab): its engine steps the whole batch
      in one call, so it runs in this process as one
      :class:`~rlinf_cli.runtime.batched.BatchedVecEnv`; no env workers, whatever the mode.
    - a :class:`~rlinf_cli.api.HostedSimulator` (``sim=remote``): its envs already run on env
      servers, so the executor starts no workers. ``runtime.env_workers`` (0 = the simulator's
      default: one session per server core, one per server when the served simulator is batched)
      sets how many sessions the envs are spread over; ``runtime.mode=hybrid`` pipelines them in
      ``pipeline_stages`` groups as for local workers (not for a batched served simulator: each
      session holds one batch); other modes step all sessions synchronously. Crash recovery
      (``runtime.max_restarts``) reopens lost sessions.
    """
    from rlinf_cli.api import BatchedSimulator, HostedSimulator

    if isinstance(simulator, BatchedSimulator) and not isinstance(simulator, HostedSimulator):
        from rlinf_cli.runtime.batched import shard_vec_env

        env = shard_vec_env(simulator, range(num_envs), autoreset)
        env.label = f"{num_envs} envs as one batch of the simulator's own engine, in this process (no env workers)"
        return env
    if not isinstance(simulator, HostedSimulator):
        return None
    batched = bool(getattr(simulator, "batched", False))
    workers = max(1, min(num_envs, rt.env_workers or simulator.default_workers(num_envs)))
    stages = min(rt.pipeline_stages, num_envs) if rt.mode == "hybrid" and not batched else 1
    shards = plan_shards(num_envs, workers, stages)
    try:
        handles = simulator.connect_workers([worker_shards(shards, w) for w in range(workers)], autoreset, rt.codec,
                                            rt.worker_timeout_s)
    except RemoteError as exc:
        raise EnvWorkerError(f"the remote simulator failed to create its envs: {last_line(exc.args[0] if exc.args else '', 'error')}") from exc
    except WorkerDied as exc:
        raise EnvWorkerError(f"could not open env sessions: {exc}") from exc
    label = (f"{executor}, {'hybrid' if stages > 1 else 'synchronous'}: {num_envs} envs in {workers} session(s) on "
             f"{simulator.describe()}" + (f", {stages} pipeline stages" if stages > 1 else "")
             + f", obs_compression={rt.obs_compression}" + ("+xor-delta" if rt.obs_delta else "")
             + (", one batch per session" if batched else ""))
    return WorkerVecEnv(simulator.spec, num_envs, autoreset, shards, handles, rt.codec, None, rt.max_restarts, label)


