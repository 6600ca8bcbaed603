"""Trainer ranks as processes on this machine (``placement.trainer.ranks`` with ``executor=local``):
what ``torchrun --nproc_per_node=K`` does, started by the executor.

Each rank is a fresh ``spawn`` process (no inherited torch threads) started with torchrun's variables
already in its environment, so anything that reads them at import time sees them as under torchrun;
it runs ``rlinf_cli.api.run_rank`` and sends back its result, or what went wrong, through a pipe.
A rank whose pipe closes without a word died (killed, out of memory): the others are stopped and
``RankDied`` names it.
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import os
import signal
import socket
import sys
import traceback
from multiprocessing.connection import wait
from typing import Any, Iterator

from rlinf_cli.api import RankDied, RankJob, UserError, run_rank


def _child(conn: Any, job: RankJob, env: dict[str, str]) -> None:
    try:
        conn.send(("ok", run_rank(job, env)))
    except UserError as exc:
        conn.send(("user", str(exc)))
    except KeyboardInterrupt:  # stopped with the driver (Ctrl-C reaches the whole process group): it says so
        pass
    except BaseException:  # anything else: the driver prints the rank's traceback
        conn.send(("error", traceback.format_exc()))
    finally:
        conn.close()


@contextlib.contextmanager
def _environ(env: dict[str, str]) -> Iterator[None]:
    """``env`` in this process's environment while a child is spawned (it inherits it), then undone."""
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _how(code: int | None) -> str:
    if code is None:
        return "its pipe closed"
    if code < 0:
        return f"killed by {signal.Signals(-code).name}"
    return f"exit code {code}"


def start_ranks(job: RankJob) -> Any:
    """Run ``job.ranks`` rank processes on this machine; rank 0's result."""
    ctx = mp.get_context("spawn")
    port = _free_port()
    procs: list[Any] = []
    conns: list[Any] = []
    try:
        for rank in range(job.ranks):
            env = {**job.rank_env(rank, rank, job.ranks, "127.0.0.1", port),
                   "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}  # as torchrun sets it
            recv, send = ctx.Pipe(duplex=False)
            proc = ctx.Process(target=_child, args=(send, job, env), name=f"rlinf-rank{rank}")
            with _environ(env):
                proc.start()
            send.close()  # only the child holds the sending end: its death closes the pipe
            procs.append(proc)
            conns.append(recv)
        return _wait(procs, conns)
    finally:
        for proc in procs:
            if proc.is_alive():
                proc.kill()
            proc.join(10)


def _wait(procs: list[Any], conns: list[Any]) -> Any:
    pending = set(range(len(procs)))
    result = None
    while pending:
        for conn in wait([conns[r] for r in sorted(pending)]):
            rank = conns.index(conn)
            pending.discard(rank)
            try:
                kind, value = conn.recv()
            except EOFError:  # the process ended without a word
                procs[rank].join(10)
                raise RankDied(rank, f"its process {procs[rank].pid} ended ({_how(procs[rank].exitcode)})") from None
            if kind == "user":
                raise UserError(value)
            if kind == "error":
                sys.stderr.write(value)
                raise RankDied(rank, f"it raised {value.strip().splitlines()[-1]}")
            if rank == 0:
                result = value
    return result
