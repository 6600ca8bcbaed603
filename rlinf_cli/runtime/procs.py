"""Env worker processes on this machine: a pipe per worker, observations in shared memory.

Shared by the local executor and by `rlinf env serve` (which hosts each client session's envs in
one such process).

A worker is started with ``forkserver`` (default) or ``spawn``, so it never inherits the
driver's torch threads or GL contexts; the simulator travels pickled and is unpickled only
after the worker has pinned its thread pools to one thread.
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import os
import pickle
import sys
import time
import traceback
from typing import TYPE_CHECKING, Any, Callable, Iterator, Sequence

import numpy as np

from rlinf_cli.runtime.codec import CodecConfig, Packed
from rlinf_cli.runtime.env_worker import Reply
from rlinf_cli.runtime.workers import RemoteError, WorkerDied, start_all

if TYPE_CHECKING:
    from rlinf_cli.runtime.hosting import WorkerPlan

# One thread per worker for every pool a simulator may bring: BLAS/OpenMP, and Mesa's llvmpipe
# rasteriser (LP_NUM_THREADS), whose per-frame thread hand-offs stall when workers already
# fill the cores.
_THREAD_VARS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "LP_NUM_THREADS")


# -- wire format -------------------------------------------------------------------------------
# Pickling a small numpy array costs ~10 us each way (its reduce protocol runs Python code);
# a step reply holds five of them. Arrays therefore cross the pipe as (bytes, dtype, shape)
# triples, which pickle as plain bytes: a request/reply round trip drops from ~100 us to ~25 us.
class _Nd(tuple):
    """Marker for an array sent as (bytes, dtype, shape)."""


def _convert(x: Any, kind: type, leaf: Callable[[Any], Any]) -> Any:
    """``x`` with ``leaf`` applied to each ``kind`` inside it (in Packed entries, dicts, tuples, lists, Replies)."""
    t = type(x)
    if t is kind:
        return leaf(x)
    if t is Packed:
        return x._replace(data=_convert(x.data, kind, leaf))
    if t is dict:
        return {k: _convert(v, kind, leaf) for k, v in x.items()}
    if t in (tuple, list, Reply):
        items = [_convert(v, kind, leaf) for v in x]
        return Reply(*items) if t is Reply else t(items)
    return x


def _send(conn: Any, obj: Any) -> None:
    # text entries (object arrays of str) pickle as they are
    out = _convert(obj, np.ndarray, lambda a: a if a.dtype == object else _Nd((a.tobytes(), a.dtype.str, a.shape)))
    conn.send_bytes(pickle.dumps(out, protocol=pickle.HIGHEST_PROTOCOL))


def _recv(conn: Any) -> Any:
    return _convert(pickle.loads(conn.recv_bytes()), _Nd, lambda a: np.frombuffer(a[0], dtype=a[1]).reshape(a[2]))


def worker_main(conn: Any, sim_bytes: bytes, shards: list[tuple[int, int]], autoreset: bool, codec: CodecConfig,
                shm_name: str | None, num_envs: int, environ: dict[str, str]) -> None:
    """Entry point of a worker process: build the envs, then serve requests until ``close``."""
    # A forkserver child inherits the server's environment, frozen when the server started;
    # the driver's environment of now (MUJOCO_GL set by a simulator, ...) is what counts.
    os.environ.update(environ)
    for var in _THREAD_VARS:
        os.environ[var] = "1"
    if "torch" in sys.modules:  # a simulator that uses torch must not fight the driver for cores
        sys.modules["torch"].set_num_threads(1)
    try:
        from rlinf_cli.runtime.env_worker import EnvWorker

        simulator = pickle.loads(sim_bytes)
        if "torch" in sys.modules:
            sys.modules["torch"].set_num_threads(1)
        worker = EnvWorker(simulator, shards, autoreset, codec, shm_name, num_envs)
    except BaseException:
        _send(conn, ("error", traceback.format_exc()))
        return
    serve(conn, worker)


def hosted_main(conn: Any, factory: Callable[..., Any], args: tuple, environ: dict[str, str]) -> None:
    """Entry point of a process hosting ``factory(*args)`` (a generation worker): serve it until ``close``."""
    os.environ.update(environ)
    try:
        worker = factory(*args)
    except BaseException:
        _send(conn, ("error", traceback.format_exc()))
        return
    serve(conn, worker)


def serve(conn: Any, worker: Any) -> None:
    """Say ready, then run ``worker.<method>(*args)`` for each request until ``close`` or the driver goes."""
    _send(conn, ("ok", os.getpid()))
    while True:
        try:
            method, args = _recv(conn)
        except (EOFError, OSError, KeyboardInterrupt):  # the driver went away
            break
        if method == "close":
            try:
                worker.close()
            finally:
                _send(conn, ("ok", None))
            break
        try:
            reply = getattr(worker, method)(*args)
        except KeyboardInterrupt:
            break
        except BaseException:
            _send(conn, ("error", traceback.format_exc()))
            continue
        _send(conn, ("ok", reply))


@contextlib.contextmanager
def _main_not_rerun() -> Iterator[None]:
    """Start a child without re-running the driver's ``__main__`` script in it.

    spawn/forkserver children re-execute a script-style ``__main__`` (and its imports: torch,
    2-4 s per worker on a busy 2-core machine) unless it lacks ``__file__``. Workers need
    nothing from it: their target and arguments live in importable modules (simulators come
    from plugin packages), so ``__file__`` is hidden while the child starts.
    """
    main = sys.modules.get("__main__")
    if main is None or getattr(main, "__spec__", None) is not None or not hasattr(main, "__file__"):
        yield
        return
    saved = main.__file__
    del main.__file__
    try:
        yield
    finally:
        main.__file__ = saved


class ChildProcess:
    """A :class:`~rlinf_cli.runtime.workers.WorkerHandle` for one local process running
    ``target(conn, *args)`` (a serving loop: :func:`worker_main`, :func:`hosted_main`)."""

    def __init__(self, index: int, ctx: Any, target: Callable[..., None], args: tuple, timeout_s: float, name: str):
        self.index = index
        self._ctx = ctx
        self._target, self._args, self._name = target, args, name
        self.timeout_s = timeout_s
        self.generation = 0
        self.proc: Any = None
        self.conn: Any = None
        self.start()

    # -- lifecycle ---------------------------------------------------------------------------
    def start(self) -> None:
        """Launch the process (does not wait for it to be ready: see :meth:`wait_ready`)."""
        parent, child = self._ctx.Pipe(duplex=True)
        self.proc = self._ctx.Process(target=self._target, args=(child, *self._args), daemon=True, name=self._name)
        with _main_not_rerun():
            self.proc.start()
        child.close()
        self.conn = parent
        self.generation += 1
        self._sent = 0
        self._received = 0
        self._buffer: dict[int, tuple[str, Any]] = {}

    def wait_ready(self) -> int:
        """Block until the worker built its envs; returns its pid."""
        return self.result((self.generation, -1))

    def restart(self) -> None:
        self.kill()
        self.start()
        self.wait_ready()

    def kill(self) -> None:
        if self.proc is not None and self.proc.is_alive():
            self.proc.kill()
        if self.proc is not None:
            self.proc.join(timeout=5)
        if self.conn is not None:
            self.conn.close()

    def close(self) -> None:
        if self.proc is None:
            return
        try:
            if self.proc.is_alive():
                _send(self.conn, ("close", ()))
                if self.conn.poll(5):
                    _recv(self.conn)
            self.proc.join(timeout=5)
        except (OSError, EOFError):
            pass
        finally:
            self.kill()
            self.proc = None

    def describe(self) -> str:
        return f"pid {self.proc.pid if self.proc is not None else '-'}"

    # -- requests ----------------------------------------------------------------------------
    def submit(self, method: str, *args: Any) -> tuple[int, int]:
        ticket = (self.generation, self._sent)
        self._sent += 1
        try:
            _send(self.conn, (method, args))
        except (OSError, ValueError):  # broken pipe: the worker is gone; result() reports it
            pass
        return ticket

    def result(self, ticket: tuple[int, int]) -> Any:
        gen, seq = ticket
        if gen != self.generation:
            raise WorkerDied("the worker was restarted since this request")
        # replies arrive in request order; seq -1 is the start-up message, which precedes them
        slot = seq + 1
        deadline = time.monotonic() + self.timeout_s
        while slot not in self._buffer:
            if not self.conn.poll(min(1.0, max(deadline - time.monotonic(), 0.0))):
                if not self.proc.is_alive():
                    self.proc.join(timeout=1)
                    raise WorkerDied(f"process {self.proc.pid} exited with code {self.proc.exitcode}")
                if time.monotonic() >= deadline:
                    self.kill()
                    raise WorkerDied(f"no reply in {self.timeout_s:.0f} s (runtime.worker_timeout_s); killed it")
                continue
            try:
                msg = _recv(self.conn)
            except (EOFError, OSError):
                self.proc.join(timeout=1)
                raise WorkerDied(f"process {self.proc.pid} exited with code {self.proc.exitcode}") from None
            self._buffer[self._received] = msg
            self._received += 1
        status, payload = self._buffer.pop(slot)
        if status == "error":
            raise RemoteError(payload)
        return payload


class ProcessWorker(ChildProcess):
    """The handle of one local env-worker process (:func:`worker_main`)."""

    def __init__(self, index: int, ctx: Any, sim_bytes: bytes, shards: Sequence[tuple[int, int]], autoreset: bool,
                 codec: CodecConfig, shm_name: str | None, num_envs: int, timeout_s: float):
        args = (sim_bytes, [tuple(s) for s in shards], autoreset, codec, shm_name, num_envs, dict(os.environ))
        super().__init__(index, ctx, worker_main, args, timeout_s, f"rlinf-env-worker-{index}")


def start_workers(simulator: Any, shard_lists: list[list[tuple[int, int]]], autoreset: bool, codec: CodecConfig,
                  shm_name: str | None, num_envs: int, start_method: str, timeout_s: float) -> list[ProcessWorker]:
    """Start all workers in parallel, then wait for each to be ready."""
    ctx = mp.get_context(start_method)
    if start_method == "forkserver":
        # modules the server imports once, so each forked worker starts without re-importing them
        ctx.set_forkserver_preload(["rlinf_cli.runtime.env_worker", __name__, type(simulator).__module__])
    sim_bytes = pickle.dumps(simulator)
    return start_all(lambda i: ProcessWorker(i, ctx, sim_bytes, shard_lists[i], autoreset, codec, shm_name, num_envs,
                                             timeout_s), len(shard_lists))


def start_processes(plan: "WorkerPlan") -> list[ProcessWorker]:
    """The worker processes of a :class:`~rlinf_cli.runtime.hosting.WorkerPlan` on this machine."""
    return start_workers(plan.simulator, [list(s) for s in plan.shards], plan.autoreset, plan.runtime.codec,
                         plan.shm_name, plan.num_envs, plan.runtime.start_method, plan.timeout_s)
