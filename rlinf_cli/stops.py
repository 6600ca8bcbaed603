"""Stops by signal: SIGINT and SIGTERM raise :class:`~rlinf_cli.errors.Interrupted` in the main
thread, so every stage stops the same way for both (its cleanup runs, MLflow records the run as
KILLED), except inside a :func:`deferred` block, which the stop waits for.

Why deferred blocks exist: an exception raised by a signal handler lands at whatever Python line
is running, SQLAlchemy's and MLflow's included. CI saw a stopped `rlinf sft` print "database is
locked" with MLflow's logged traceback (here: 1 stop in 15 sent right after a checkpoint; 0 in 30
with the writes deferred). The likely path, not traced line by line: a stop cut SQLAlchemy's
cleanup, a connection went back to its pool still holding sqlite's write lock, and the next write
waited out the 20 s busy timeout. Whatever the exact line, a write that is never cut cannot leave
a lock behind.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from typing import Any, Iterator

from rlinf_cli.errors import Interrupted

STOPS: list[Interrupted] = []  # this command's stops, first first (stages note on it what they saved)
_held: list[Interrupted] = []  # stops that arrived inside a deferred block, raised when it ends
_depth = 0


def install() -> dict[int, Any]:
    """Route SIGINT and SIGTERM to :func:`_stop`; returns the handlers to put back. A signal the
    process was started with ignored (a background job, nohup) stays ignored."""
    STOPS.clear()
    _held.clear()
    if threading.current_thread() is not threading.main_thread():
        return {}
    previous = {}
    for sig in (signal.SIGINT, signal.SIGTERM):
        current = signal.getsignal(sig)
        if current in (signal.default_int_handler, signal.SIG_DFL):
            previous[sig] = signal.signal(sig, _stop)
    return previous


def restore(previous: dict[int, Any]) -> None:
    for sig, handler in previous.items():
        signal.signal(sig, handler)


def _stop(signum: int, _frame: Any) -> None:
    exc = Interrupted(signum)
    STOPS.append(exc)
    if _depth > 0 and not _held:  # a second signal while one is held stops at once: the user insists
        _held.append(exc)
        return
    raise exc


def pending() -> bool:
    """A stop is held, to be raised when the outermost deferred block ends."""
    return bool(_held)


@contextlib.contextmanager
def deferred() -> Iterator[None]:
    """A stop that arrives inside the block is raised when the block ends (a second one at once).

    For short writes that must not be cut half-way: a batch of metrics, a run's final status.
    Blocks nest; the stop is raised when the outermost one ends. Only the main thread's signal
    handler holds stops, so other threads pass through unchanged."""
    global _depth
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    _depth += 1
    try:
        yield
    finally:
        _depth -= 1
        if _depth == 0 and _held:  # also when the block failed: the user asked to stop, that wins
            raise _held.pop()
