"""`rlinf ui`: the MLflow UI as a child process group that lives and dies with this command.

``mlflow ui`` starts a server with worker processes of its own. It runs in its own process group
here, and every way this command ends (Ctrl-C, SIGTERM, SIGHUP, the server failing) ends the
whole group, so no orphaned server keeps the port. Two `rlinf ui` on one port: the second is
refused at once (:func:`claim_port`), and a server that finds its port taken anyway is ended.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from typing import Any

from rlinf_cli.errors import UserError


def port_free(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def _in_use(host: str, port: int) -> UserError:
    return UserError(f"port {port} on {host} is in use (another `rlinf ui` or MLflow server?); "
                     f"stop it or pass --port {port + 1}")


def claim_port(host: str, port: int) -> socket.socket | None:
    """A claim on ``host:port`` among `rlinf ui` processes, held while this one serves.

    MLflow's server binds its port seconds after it starts, with SO_REUSEADDR, so two started
    together both pass a check that the port is free and both bind; the loser's workers then fail
    to listen and are restarted forever. The claim is an abstract unix socket (Linux): no file to
    leave behind, and the kernel drops it when this process ends, however it ends. Elsewhere:
    None (the port check alone)."""
    if not sys.platform.startswith("linux"):
        return None
    claim = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        claim.bind(f"\0rlinf-ui-{host}-{port}")
    except OSError:
        claim.close()
        raise _in_use(host, port) from None
    return claim


def _relay(stream: Any, pgid: int, seen: dict[str, bool]) -> None:
    """Copy the server's stderr to ours; a server that finds its port taken (by a process that bound
    it after our check) is ended at once instead of restarting its workers forever."""
    for raw in iter(stream.readline, b""):
        try:  # never stop draining the pipe (a server blocked on a full pipe would hang)
            out = getattr(sys.stderr, "buffer", None)
            if out is not None:
                out.write(raw)
            else:
                sys.stderr.write(raw.decode(errors="replace"))
            sys.stderr.flush()
        except (OSError, ValueError):
            pass
        if b"address already in use" in raw.lower() and not seen["port_in_use"]:
            seen["port_in_use"] = True
            _signal_group(pgid, signal.SIGTERM)
    stream.close()


def serve(uri: str, port: int, host: str = "127.0.0.1") -> int:
    """Run the MLflow UI for ``uri`` until interrupted; returns the exit code for the CLI."""
    claim = claim_port(host, port)
    try:
        if not port_free(host, port):
            raise _in_use(host, port)
        return _serve(uri, port, host)
    finally:
        if claim is not None:
            claim.close()


def _serve(uri: str, port: int, host: str) -> int:
    import threading

    print(f"MLflow UI for {uri} on http://{host}:{port} (Ctrl-C stops it)", flush=True)
    # MLflow's job runner (GenAI evaluation jobs) is not needed to browse runs, and its workers
    # outlive the server when MLflow is stopped: leave it off.
    env = {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
    proc = subprocess.Popen([sys.executable, "-m", "mlflow", "ui", "--backend-store-uri", uri,
                             "--host", host, "--port", str(port)], start_new_session=True, env=env,
                            stderr=subprocess.PIPE)
    seen = {"port_in_use": False}
    relay = threading.Thread(target=_relay, args=(proc.stderr, proc.pid, seen), daemon=True)
    relay.start()
    # A watchdog ends the server's process group when this process ends in a way no handler sees
    # (kill -9): it waits for EOF on a pipe that only this process holds open.
    watchdog = subprocess.Popen([sys.executable, "-c", _WATCHDOG, str(proc.pid)], stdin=subprocess.PIPE,
                                start_new_session=True)
    stop = {"signal": 0}

    def forward(signum: int, _frame: Any) -> None:
        stop["signal"] = signum
        _signal_group(proc.pid, signal.SIGTERM)

    previous = {s: signal.signal(s, forward) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    try:
        code = proc.wait()
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
        _end_group(proc)
        watchdog.stdin.close()  # type: ignore[union-attr]
        watchdog.wait()
        relay.join(timeout=5)
    if seen["port_in_use"]:
        raise _in_use(host, port)
    if stop["signal"]:
        return 128 + stop["signal"] if stop["signal"] != signal.SIGINT else 130
    if code != 0:
        raise UserError(f"the MLflow UI exited with code {code} (see its messages above)")
    return 0


_WATCHDOG = """
import os, signal, sys, time
sys.stdin.buffer.read()  # returns when the rlinf ui process has ended, however it ended
group = int(sys.argv[1])
for sig, wait in ((signal.SIGTERM, 5.0), (signal.SIGKILL, 0.0)):
    try:
        os.killpg(group, sig)
    except (ProcessLookupError, PermissionError):
        break
    end = time.monotonic() + wait
    while time.monotonic() < end:
        try:
            os.killpg(group, 0)
        except (ProcessLookupError, PermissionError):
            sys.exit(0)
        time.sleep(0.1)
"""


def _signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _end_group(proc: subprocess.Popen) -> None:
    """TERM the whole group, wait a little, then KILL what is left (the server's workers too)."""
    import time

    _signal_group(proc.pid, signal.SIGTERM)
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and _group_alive(proc.pid):
        try:
            proc.wait(timeout=0.2)
        except subprocess.TimeoutExpired:
            pass
        time.sleep(0.05)
    _signal_group(proc.pid, signal.SIGKILL)
    try:
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        pass


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
        return True
    except (ProcessLookupError, PermissionError):
        return False
