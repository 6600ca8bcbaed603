"""The Ray head watch (rlinf_executor_ray/headwatch.py) against a stand-in GCS: a TCP listener that
closes, and a stand-in ``ray`` whose ``is_initialized`` and address the test sets."""

from __future__ import annotations

import socket
import threading
import time
from types import SimpleNamespace

import pytest

from rlinf_executor_ray import headwatch


class FakeRay:
    def __init__(self, address: str):
        self.address, self.up = address, True

    def is_initialized(self) -> bool:
        return self.up

    def get_runtime_context(self) -> SimpleNamespace:
        return SimpleNamespace(gcs_address=self.address)


@pytest.fixture
def gcs():
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(16)
    stop = threading.Event()

    def accept() -> None:
        server.settimeout(0.1)
        while not stop.is_set():
            try:
                server.accept()[0].close()
            except OSError:
                continue
    t = threading.Thread(target=accept, daemon=True)
    t.start()
    yield server, stop
    stop.set()
    server.close()


@pytest.fixture(autouse=True)
def fresh(monkeypatch):
    monkeypatch.setattr(headwatch, "_watching", [None])
    monkeypatch.setattr(headwatch, "POLL_S", 0.05)


def _ended(codes: list[int], seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and not codes:
        time.sleep(0.02)
    return bool(codes)


def test_a_lost_head_ends_the_process_with_one_line(gcs, capfd):
    server, stop = gcs
    ray, codes = FakeRay(f"127.0.0.1:{server.getsockname()[1]}"), []
    assert headwatch.watch(ray, grace_s=0.5, end=codes.append)
    assert not _ended(codes, 1.0)  # the head answers: nothing happens
    stop.set()
    server.close()
    assert _ended(codes, 5.0) and codes == [2]
    err = capfd.readouterr().err.strip().splitlines()
    assert err[-1].startswith(f"error: lost the Ray head: its GCS at {ray.address} has not answered for ")
    assert "resume=" in err[-1]


def test_leaving_the_cluster_stops_the_watch(gcs):
    server, stop = gcs
    ray, codes = FakeRay(f"127.0.0.1:{server.getsockname()[1]}"), []
    assert headwatch.watch(ray, grace_s=0.3, end=codes.append)
    ray.up = False  # ray.shutdown(): a local instance then goes away as the run ends
    stop.set()
    server.close()
    assert not _ended(codes, 1.5)
    assert headwatch._watching == [None]


def test_a_new_cluster_in_the_same_process_is_watched_instead(gcs):
    server, stop = gcs
    old = FakeRay("127.0.0.1:1")  # nothing listens there
    codes: list[int] = []
    assert headwatch.watch(old, grace_s=0.3, end=codes.append)
    old.address = f"127.0.0.1:{server.getsockname()[1]}"  # shutdown and init again: another head
    assert headwatch.watch(old, grace_s=0.3, end=codes.append)
    assert not _ended(codes, 1.0)  # the first thread saw the process leave its cluster and ended
