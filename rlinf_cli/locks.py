"""Advisory file locks (``flock``) for what several rlinf processes may touch at once.

The kernel drops a process's locks when it exits, however it exits (kill -9 included), so a
crashed run never leaves a stale lock behind. Each holder writes its pid into the lock file,
only to name it in the error another process prints.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Iterator

from rlinf_cli.errors import UserError

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows: no advisory locks; rlinf runs there unlocked
    fcntl = None  # type: ignore[assignment]


class FileLock:
    """An exclusive lock on ``path`` (created if needed), held until :meth:`release`."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self._fd: int | None = None

    def acquire(self, blocking: bool = True, busy: str = "") -> "FileLock":
        """Take the lock; with ``blocking=False`` a held lock raises :class:`UserError` (``busy``
        is the message, ``{pid}`` in it names the holder)."""
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:
            raise UserError(f"cannot create the lock file {self.path}: {exc.strerror}") from exc
        if fcntl is not None:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | (0 if blocking else fcntl.LOCK_NB))
            except BlockingIOError:
                holder = _read_pid(fd)
                os.close(fd)
                raise UserError(busy.format(pid=holder or "?")) from None
        os.ftruncate(fd, 0)
        os.write(fd, str(os.getpid()).encode())
        self._fd = fd
        return self

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing drops the flock
            self._fd = None


def _read_pid(fd: int) -> str:
    try:
        return os.pread(fd, 32, 0).decode().strip()
    except OSError:
        return ""


def abandoned(path: Path) -> bool:
    """Whether ``path`` is a lock file that names a holder no longer holding it (a process that
    was killed, so it never cleaned up what the lock guarded). False when a live process holds
    it, or when the file is missing or names nobody: only what is surely abandoned is said to be.

    The pid written into the file answers first, without touching the lock; a pid that is not
    alive here may be one in another container sharing the directory, so the lock itself
    confirms (taken shared and dropped at once)."""
    try:
        pid = int(Path(path).read_text().strip())
    except (OSError, ValueError):
        return False
    try:
        os.kill(pid, 0)
        return False  # alive (or the pid was reused: then it is left alone, the safe side)
    except PermissionError:
        return False
    except ProcessLookupError:
        pass
    if fcntl is None:
        return True
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    finally:
        os.close(fd)  # closing drops the lock
    return True


@contextlib.contextmanager
def locked(path: Path) -> Iterator[None]:
    """Hold ``path``'s lock for a block (waits for other holders)."""
    lock = FileLock(path).acquire()
    try:
        yield
    finally:
        lock.release()
