"""Losing the Ray head ends the run in one line.

When the head's GCS dies, Ray's core worker in this process keeps retrying and after
``gcs_rpc_server_reconnect_timeout_s`` (60 s) ends the process itself from C++ with exit code 1 and a
log line about the GCS: no rlinf message and no word on how to continue. A thread here checks that
the GCS still accepts connections; once it has refused (or timed out) for ``GRACE_S`` it writes one
``error:`` line and ends the process with exit code 2. What the run wrote stays: its checkpoints (the
last one is what ``resume=`` continues from) and its metrics up to them.
"""

from __future__ import annotations

import os
import socket
import sys
import threading
import time
from typing import Any, Callable

GRACE_S = 10.0  # well inside Ray's own 60 s; a head that restarts within it is not noticed
POLL_S = 1.0
_watching: list[str | None] = [None]  # the GCS address the live watch thread checks


def _reachable(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=POLL_S):
            return True
    except OSError:
        return False


def message(address: str, seconds: float) -> str:
    return (f"error: lost the Ray head: its GCS at {address} has not answered for {seconds:.0f} s (the head node "
            f"died or the network to it is down); the run stopped. Start the cluster again and continue with "
            f"`rlinf rl resume=<run_dir>/checkpoints/<its last iter_N>` (executor.address= the new head)")


def _current(ray: Any) -> str | None:
    if not ray.is_initialized():
        return None
    return getattr(ray.get_runtime_context(), "gcs_address", None)


def watch(ray: Any, grace_s: float = GRACE_S, end: Callable[[int], None] = os._exit) -> bool:
    """Watch the head of the cluster ``ray`` is connected to (one thread per process and cluster);
    False if there is none. The thread ends when the process leaves that cluster (``ray.shutdown``)."""
    address = _current(ray)
    if not address or ":" not in address:
        return False
    if _watching[0] == address:
        return True
    _watching[0] = address
    host, port = address.rsplit(":", 1)

    def loop() -> None:
        last_ok = time.monotonic()
        while True:
            time.sleep(POLL_S)
            if _watching[0] != address or _current(ray) != address:  # left this cluster (or joined another)
                if _watching[0] == address:
                    _watching[0] = None
                return
            if _reachable(host, int(port)):
                last_ok = time.monotonic()
            elif time.monotonic() - last_ok >= grace_s and _current(ray) == address:
                sys.stdout.flush()
                sys.stderr.write("\n" + message(address, time.monotonic() - last_ok) + "\n")
                sys.stderr.flush()
                end(2)
                return

    threading.Thread(target=loop, name="rlinf-ray-head-watch", daemon=True).start()
    return True
