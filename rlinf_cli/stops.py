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

Why :func:`_unraisable`: Python drops an exception raised inside a ``__del__`` or a weakref callback
("Exception ignored in: ..."), and a signal's handler runs wherever the main thread is, garbage
collection included. A suite run saw `rlinf eval` go on evaluating for minutes after SIGINT, its
stderr holding "Exception ignored in: <bound method _MultipleClassMarker._remove_item ...>"
(SQLAlchemy's class registry, a weakref callback): the stop had been raised there and dropped. A
dropped stop is delivered again, by the same signal, until it lands in ordinary code.
"""

from __future__ import annotations

import contextlib
import signal
import sys
import threading
from typing import Any, Iterator

from rlinf_cli.errors import Interrupted

STOPS: list[Interrupted] = []  # this command's stops, first first (stages note on it what they saved)
_held: list[Interrupted] = []  # stops that arrived inside a deferred block, raised when it ends
_depth = 0
_again: list[Interrupted] = []  # a stop Python dropped (raised in a __del__ or weakref callback), sent again
_hook: list[Any] = []  # sys.unraisablehook before install()


def install() -> dict[int, Any]:
    """Route SIGINT and SIGTERM to :func:`_stop`; returns the handlers to put back. A signal the
    process was started with ignored (a background job, nohup) stays ignored."""
    STOPS.clear()
    _held.clear()
    _again.clear()
    if threading.current_thread() is not threading.main_thread():
        return {}
    if not _hook:
        _hook.append(sys.unraisablehook)
        sys.unraisablehook = _unraisable
    previous = {}
    for sig in (signal.SIGINT, signal.SIGTERM):
        current = signal.getsignal(sig)
        if current in (signal.default_int_handler, signal.SIG_DFL):
            previous[sig] = signal.signal(sig, _stop)
    return previous


def restore(previous: dict[int, Any]) -> None:
    for sig, handler in previous.items():
        signal.signal(sig, handler)
    if _hook and sys.unraisablehook is _unraisable:
        sys.unraisablehook = _hook.pop()


def _unraisable(unraisable: Any) -> None:
    """sys.unraisablehook: a stop of this command that Python dropped is sent again (see the module's
    doc); anything else goes to the hook that was there before."""
    exc = unraisable.exc_value
    if isinstance(exc, Interrupted) and any(exc is s for s in STOPS):
        _again.append(exc)
        # from another thread, a little later: a signal raised here would run its handler inside this
        # hook, where an exception is dropped too
        threading.Timer(0.01, signal.pthread_kill, (threading.main_thread().ident, exc.signum)).start()
        return
    (_hook[0] if _hook else sys.__unraisablehook__)(unraisable)


def _stop(signum: int, _frame: Any) -> None:
    if _again:  # the same stop, delivered again: not a second one
        exc = _again.pop()
    else:
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
