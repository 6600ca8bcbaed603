"""The driver side of env workers: simulator instances stepped away from the driver, in
processes, Ray actors or env-server sessions.

Each worker owns the shards of its slice (:func:`~rlinf_cli.runtime.placement.plan_shards`) and
steps one shard per request; the driver (:class:`WorkerVecEnv`) assembles shards into the batch a
policy sees. Transport is abstract: an executor supplies one :class:`WorkerHandle` per worker (a
process with a pipe, a Ray actor, ...). What is common lives here: the errors a handle raises,
crash recovery and the grouped stepping that lets the hybrid mode overlap simulation with policy
inference. What a worker runs is :mod:`rlinf_cli.runtime.env_worker`; how the core decides where
envs run and asks an executor for workers is :mod:`rlinf_cli.runtime.hosting`.
"""

from __future__ import annotations

from typing import Any, Protocol, Sequence

import numpy as np

from rlinf_cli.api import EnvSpec, Obs, StepBatch
from rlinf_cli.errors import UserError
from rlinf_cli.runtime.codec import CodecConfig, ObsDecoder
from rlinf_cli.runtime.env_worker import Reply, SharedObs
from rlinf_cli.runtime.placement import Shard
from rlinf_cli.runtime.vector import SeededVecEnv, alloc_obs


class EnvWorkerError(UserError):
    """An env worker failed for good (its simulator raised, or it crashed too often).

    ``server_lost``: the env server hosting it is gone; a training stage adds how to resume.
    """

    exit_code = 3

    def __init__(self, message: str, server_lost: bool = False):
        super().__init__(message)
        self.server_lost = server_lost


class WorkerDied(Exception):
    """Transport-level loss of a worker: the process exited, the actor died, or it went silent."""


class ConnectionLost(WorkerDied):
    """The connection to the machine hosting a worker broke (an env server was killed or
    restarted, the network dropped): the worker itself may be fine, and the host may come back.

    ``address`` names the host; ``reconnect_s`` is how long its handle retries on ``restart``.
    Such a loss does not count against ``runtime.max_restarts`` (the reconnect window bounds it),
    unless the worker is lost again before it served a step.
    """

    def __init__(self, message: str, address: str, reconnect_s: float):
        super().__init__(message)
        self.address = address
        self.reconnect_s = reconnect_s


class RemoteError(Exception):
    """The simulator raised inside a worker; ``args[0]`` is the remote traceback text."""


def start_all(make: Any, n: int) -> list[Any]:
    """``n`` worker handles ``make(0) .. make(n-1)``, started together, then each waited for:
    all of them ready, or none left running."""
    workers: list[Any] = []
    try:
        for i in range(n):
            workers.append(make(i))
        for w in workers:
            w.wait_ready()
    except BaseException:
        for w in workers:
            w.kill()
        raise
    return workers


def warn(message: str) -> None:
    """One plain ``warning: ...`` line on stderr, like the CLI's other notes; not :mod:`warnings`,
    which would add a file path and a source line. ``sys.stderr`` is looked up at each call, so a
    live progress bar that redirects it keeps the line above the bar."""
    import sys

    print(f"warning: {message}", file=sys.stderr, flush=True)


def last_line(text: Any, default: str) -> str:
    """The last line of a remote traceback or error text: the exception itself."""
    t = str(text).strip()
    return t.splitlines()[-1] if t else default


class WorkerHandle(Protocol):
    """How the driver talks to one worker. Calls on one handle execute in submission order."""

    def submit(self, method: str, *args: Any) -> Any:
        """Send ``EnvWorker.<method>(*args)``; returns a ticket for :meth:`result`."""
        ...

    def result(self, ticket: Any) -> Any:
        """Block for a ticket's reply. Raises :class:`WorkerDied` or :class:`RemoteError`."""
        ...

    def restart(self) -> None:
        """Replace a dead worker by a fresh one hosting the same shards; old tickets are void."""
        ...

    def close(self) -> None: ...

    def describe(self) -> str: ...


class WorkerVecEnv(SeededVecEnv):
    """A VecEnv whose shards live in workers; also steps pipeline groups asynchronously.

    ``step_group_async(g, actions)`` / ``step_group_wait(g)`` let a runner infer the actions of
    group ``g + 1`` while the workers simulate group ``g``; ``step`` is the synchronous
    all-groups step every VecEnv has.
    """

    def __init__(self, spec: EnvSpec, num_envs: int, autoreset: bool, shards: list[Shard],
                 handles: list[WorkerHandle], codec: CodecConfig, shm: SharedObs | None = None,
                 max_restarts: int = 3, label: str = "workers"):
        super().__init__(spec, num_envs, autoreset)
        self.shards = shards
        self.handles = handles
        self.shm = shm
        self.max_restarts = max_restarts
        # per worker (= per env batch): one crashing worker must not use up another's budget
        self.restarts = [0] * len(handles)
        # whether each worker served a step since it was (re)started: a lost connection is free
        # only then, so a host that goes down again before serving anything cannot loop forever
        self._served = [True] * len(handles)
        self.label = label
        self.num_groups = max(s.group for s in shards) + 1
        self.pipeline_groups = [(min(s.lo for s in shards if s.group == g), max(s.hi for s in shards if s.group == g))
                                for g in range(self.num_groups)]
        # shard id -> index of the shard inside its worker (a worker's shards are numbered in order)
        self._local = {sid: sum(t.worker == s.worker for t in shards[:sid]) for sid, s in enumerate(shards)}
        self._decoders = [ObsDecoder(codec) for _ in shards]
        self._replay: list[np.ndarray] | None = None  # actions of the restore in progress (a retry needs them)
        self._pending: dict[int, Any] = {}  # shard id -> ticket of its in-flight step
        self._fabricated: dict[int, Reply] = {}  # shard id -> reply standing in for a lost step
        self._reset_done: set[int] = set()  # shards re-reset by a recovery during reset()
        self._closed = False

    # -- VecEnv --------------------------------------------------------------------------
    def restore(self, streams: Sequence[int | None], episodes: Sequence[int],
                actions: Sequence[np.ndarray] | None) -> Obs:
        self._drain()
        self._fabricated.clear()
        self._reset_done.clear()
        self._streams = [None if s is None else int(s) for s in streams]
        self._episodes[:] = episodes
        self._replay = list(actions) if actions is not None else None
        tickets = {sid: self.handles[s.worker].submit("restore", self._local[sid], *self._restore_args(s))
                   for sid, s in enumerate(self.shards)}
        for sid, ticket in tickets.items():
            if sid in self._reset_done:  # its worker was restarted (and re-restored) while we waited
                continue
            reply = self._wait(sid, ticket, "reset")
            self._store_obs(sid, reply)
        self._replay = None
        return self._copy_obs()

    def _restore_args(self, s: Shard, next_episode: bool = False) -> tuple[list, list, list | None]:
        episodes = self._episodes[s.lo:s.hi] + (1 if next_episode else 0)
        replay = None if self._replay is None or next_episode else self._replay[s.lo:s.hi]
        return self._streams[s.lo:s.hi], [int(k) for k in episodes], replay

    def step(self, actions: np.ndarray) -> StepBatch:
        for g, (lo, hi) in enumerate(self.pipeline_groups):
            self.step_group_async(g, actions[lo:hi])
        return self._wait_step(range(len(self.shards)), 0, self.num_envs)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for h in self.handles:
            try:
                h.close()
            except Exception:  # closing must not mask the error that made us close
                pass
        if self.shm is not None:
            self.shm.close()

    def describe(self) -> str:
        return self.label

    # -- pipelined groups ------------------------------------------------------------------
    def step_group_async(self, g: int, actions: np.ndarray) -> None:
        """Start stepping group ``g`` (``actions`` covers the group's envs only)."""
        base = self.pipeline_groups[g][0]
        for sid, s in enumerate(self.shards):
            if s.group != g:
                continue
            if sid in self._pending:
                raise RuntimeError(f"group {g} is already stepping")
            if sid in self._fabricated:
                self._pending[sid] = None
                continue
            a = np.ascontiguousarray(actions[s.lo - base:s.hi - base])
            self._pending[sid] = self.handles[s.worker].submit("step", self._local[sid], a)

    def step_group_wait(self, g: int) -> StepBatch:
        """Finish group ``g``'s step; the StepBatch covers the group's envs only."""
        lo, hi = self.pipeline_groups[g]
        return self._wait_step([sid for sid, s in enumerate(self.shards) if s.group == g], lo, hi)

    # -- internals -------------------------------------------------------------------------
    def _wait_step(self, sids: Sequence[int], lo: int, hi: int) -> StepBatch:
        """Collect the step replies of shards ``sids``, which cover envs ``lo .. hi - 1``."""
        n = hi - lo
        reward = np.zeros(n, dtype=np.float32)
        terminated = np.zeros(n, dtype=bool)
        truncated = np.zeros(n, dtype=bool)
        success = np.zeros(n, dtype=bool)
        final_obs: Obs | None = None
        stats: dict[str, float] = {}
        for sid in sids:
            s = self.shards[sid]
            ticket = self._pending.pop(sid)
            reply = self._fabricated.pop(sid) if ticket is None else self._wait(sid, ticket, "step")
            a, b = s.lo - lo, s.hi - lo
            if reply.final_obs is not None:
                if final_obs is None:
                    final_obs = alloc_obs(self.spec, n)
                for k, v in reply.final_obs.items():
                    final_obs[k][a:b] = v
            self._store_obs(sid, reply)
            reward[a:b] = reply.reward
            terminated[a:b] = reply.terminated
            truncated[a:b] = reply.truncated
            if self.autoreset:  # the worker's env moved on to the next episode of its stream
                self._episodes[s.lo:s.hi] += reply.terminated | reply.truncated
            success[a:b] = reply.success
            for k, v in reply.stats.items():
                stats[k] = stats.get(k, 0.0) + v
        obs = {k: v[lo:hi].copy() for k, v in self._obs.items()}
        return StepBatch(obs, reward, terminated, truncated, success, final_obs, stats)

    def _store_obs(self, sid: int, reply: Reply) -> None:
        s = self.shards[sid]
        # numeric entries come through shared memory (reply.obs: None, or the text entries); a
        # fabricated reply (obs={}) stands for a lost step whose observations are already stored
        if self.shm is not None and (reply.obs is None or reply.obs):
            for k, v in self.shm.arrays.items():
                self._obs[k][s.lo:s.hi] = v[s.lo:s.hi]
        if not reply.obs:  # all in shared memory (a fabricated reply has obs={}: already stored)
            return
        _, dt = self._decoders[sid].decode(reply.obs, {k: v[s.lo:s.hi] for k, v in self._obs.items() if k in reply.obs})
        reply.stats["transport/decode_s"] = reply.stats.get("transport/decode_s", 0.0) + dt

    def _drain(self) -> None:
        """Collect replies still in flight (a rollout stopped mid-pipeline) before a reset."""
        for sid in list(self._pending):
            ticket = self._pending.pop(sid)
            if ticket is not None:
                self._wait(sid, ticket, "step")
        self._fabricated.clear()

    def _wait(self, sid: int, ticket: Any, what: str) -> Reply:
        s = self.shards[sid]
        handle = self.handles[s.worker]
        try:
            reply = handle.result(ticket)
        except RemoteError as exc:
            last = last_line(exc.args[0] if exc.args else "", "unknown error")
            raise EnvWorkerError(f"env worker {s.worker} (envs {s.lo}-{s.hi - 1}) failed in {what}: {last}") from exc
        except WorkerDied as exc:
            return self._recover(s.worker, sid, what, exc)
        if what == "step":
            self._served[s.worker] = True
        return reply

    def _recover(self, w: int, sid: int, what: str, lost: WorkerDied) -> Reply:
        """Restart worker ``w``. Interrupted episodes are reported truncated; its envs start anew."""
        mine = [i for i, s in enumerate(self.shards) if s.worker == w]
        envs = f"envs {self.shards[mine[0]].lo}-{self.shards[mine[-1]].hi - 1}"
        handle = self.handles[w]
        # the observations the interrupted episodes end on (taken once: a retried restore overwrites them)
        last = {i: {k: v[self.shards[i].lo:self.shards[i].hi].copy() for k, v in self._obs.items()} for i in mine}
        replies: dict[int, Reply] = {}
        during = what
        while True:
            self._restart(w, envs, during, lost)
            try:
                for i in mine:
                    s = self.shards[i]
                    self._decoders[i].reset()
                    # a reset (or restore) is retried as asked; an interrupted episode counts as
                    # ended (truncated) and its env starts the next episode of its seed stream
                    args = self._restore_args(s, next_episode=what != "reset")
                    replies[i] = handle.result(handle.submit("restore", self._local[i], *args))
                    if not self.autoreset and what != "reset":
                        handle.result(handle.submit("park", self._local[i]))
                break
            except WorkerDied as exc:  # lost again before it served a step: this one counts (see _restart)
                lost, during = exc, "its restore after a restart"
            except RemoteError as exc:
                text = last_line(exc.args[0] if exc.args else "", "unknown error")
                raise EnvWorkerError(f"env worker {w} ({envs}) failed again right after a restart: {text}") from exc
        result: Reply | None = None
        for i in mine:
            s = self.shards[i]
            n = s.hi - s.lo
            self._store_obs(i, replies[i])
            if what == "reset":
                self._reset_done.add(i)
                if i == sid:
                    result = replies[i]
                continue
            if not self.autoreset:  # parked envs repeat their last observation until the next reset
                for k, v in last[i].items():
                    self._obs[k][s.lo:s.hi] = v
            stats = {"runtime/worker_restarts": 1.0} if i == sid else {}
            fabricated = Reply({}, np.zeros(n, np.float32), np.zeros(n, bool), np.ones(n, bool), np.zeros(n, bool),
                               last[i], stats)
            if i != sid and self._pending.get(i) is not None:
                self._pending[i] = None  # its reply was lost with the worker
            self._fabricated[i] = fabricated
        return result if result is not None else self._fabricated.pop(sid)

    def _restart(self, w: int, envs: str, what: str, lost: WorkerDied) -> None:
        """Replace worker ``w`` (lost during ``what``), within its restart budget; a lost
        connection after the worker served a step is free (its handle's reconnect window bounds it)."""
        why = str(lost)
        free = isinstance(lost, ConnectionLost) and self._served[w]
        if not free:
            if self.restarts[w] >= self.max_restarts:
                if isinstance(lost, ConnectionLost):
                    raise EnvWorkerError(
                        f"env worker {w} ({envs}): {why} during {what}, again before it served a step since its last "
                        f"restart; restarted {self.restarts[w]} time(s) already (runtime.max_restarts={self.max_restarts}). "
                        f"Check the log and memory of env server {lost.address}, restart `rlinf env serve` there, then "
                        f"resume the run from its last checkpoint", server_lost=True)
                raise EnvWorkerError(
                    f"env worker {w} ({envs}) died during {what} ({why}); restarted {self.restarts[w]} time(s) already "
                    f"(runtime.max_restarts={self.max_restarts}, per env worker). Check the simulator (memory, crashes) "
                    f"or raise runtime.max_restarts")
            self.restarts[w] += 1
        if free:
            warn(f"env worker {w} ({envs}): {why} during {what}; reconnecting for up to {lost.reconnect_s:g} s "
                 f"(sim.reconnect_s); its running episodes count as truncated")
        else:
            warn(f"env worker {w} ({envs}) died during {what} ({why}); restarting it ({self.restarts[w]}/"
                 f"{self.max_restarts} for this worker); its running episodes count as truncated")
        self._served[w] = False
        try:
            self.handles[w].restart()
        except ConnectionLost as exc:
            raise EnvWorkerError(
                f"env server {exc.address} was lost during {what} ({why}) and could not be reached again within "
                f"sim.reconnect_s={exc.reconnect_s:g} s (last attempt: {exc}); env worker {w} ({envs}) cannot go on. "
                f"Restart `rlinf env serve` on that host, then resume the run from its last checkpoint",
                server_lost=True) from exc
        except Exception as exc:
            raise EnvWorkerError(f"env worker {w} ({envs}) died during {what} ({why}) and could not be restarted: {exc}") from exc
