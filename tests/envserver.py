"""`rlinf env serve` as a subprocess, for every test suite that starts a server (remote,
ManiSkill, Isaac Lab, LIBERO)."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import threading
import time
from pathlib import Path
from typing import Iterator, Sequence


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def env_server(command: Sequence[str | Path], *args: str, port: int | None = None, timeout: float = 60.0,
               env: dict | None = None) -> Iterator[tuple[subprocess.Popen, str]]:
    """``<command> env serve ARGS port=P``; yields ``(process, "127.0.0.1:P")`` once it serves.

    Waits for the server's own "serving on" line, not for the port to accept connections: with
    tests running in parallel, another test's server may hold a port that was free a moment ago,
    and a test must never drive (or stop) a server other than the one it started.
    """
    port = port or free_port()
    proc = subprocess.Popen([*map(str, command), "env", "serve", *args, f"port={port}"], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, env={**os.environ, **(env or {})})
    lines: list[str] = []
    ready = threading.Event()

    def read() -> None:
        for line in proc.stdout:
            lines.append(line)
            if line.startswith("rlinf env server:") and line.rstrip().endswith(f":{port}"):
                ready.set()

    threading.Thread(target=read, daemon=True).start()
    try:
        deadline = time.monotonic() + timeout
        while not ready.wait(0.2):
            assert proc.poll() is None and time.monotonic() < deadline, \
                f"`env serve {' '.join(args)}` did not start in {timeout:g} s: " + "".join(lines)[-3000:]
        yield proc, f"127.0.0.1:{port}"
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGCONT)  # a test may have stopped it
            proc.terminate()
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)
