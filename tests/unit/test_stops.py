"""A stop (SIGINT/SIGTERM) that arrives during an MLflow write waits for the write to end.

CI saw `rlinf sft` stopped by SIGINT print "database is locked" and a traceback: the stop had landed
inside SQLAlchemy, a connection went back to the pool still holding sqlite's write lock, and the
next write waited 20 s for it. These tests send the signal from inside the store's write itself."""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest
from omegaconf import OmegaConf

from rlinf_cli import stops
from rlinf_cli.errors import Interrupted
from rlinf_cli.tracking import Tracker


@pytest.fixture
def handlers():
    """rlinf's handler on both signals, whatever this worker process has on them: stops.install()
    leaves a handler it did not expect in place, and an earlier test's ray.init() puts one on
    SIGTERM for good, which ends the process (it took a pytest-xdist worker down with it once)."""
    if threading.current_thread() is not threading.main_thread():
        pytest.skip("signal handlers live in the main thread")
    stops.install()
    previous = {sig: signal.signal(sig, stops._stop) for sig in (signal.SIGINT, signal.SIGTERM)}
    yield
    stops.restore(previous)


def _cfg(tmp_path):
    return OmegaConf.create({"runs_dir": str(tmp_path / "runs"), "tracking": {
        "enabled": True, "uri": None, "experiment": "rlinf", "run_name": None, "flush_s": 1000}})


def _signal_inside(monkeypatch, cls, name: str, sig: int = signal.SIGINT, times: int = 1) -> list[str]:
    """Make ``cls.name`` send ``sig`` to this process half-way through (after its first statement
    ran); returns a log of what ran."""
    real = getattr(cls, name)
    log: list[str] = []

    def wrapped(self, *a, **k):
        for _ in range(times):
            os.kill(os.getpid(), sig)
            time.sleep(0.01)  # the handler runs here: without deferral the write is cut now
        log.append("signalled")
        out = real(self, *a, **k)
        log.append("write done")
        return out

    monkeypatch.setattr(cls, name, wrapped)
    return log


def test_a_stop_inside_a_metric_batch_lets_it_finish_then_stops(tmp_path, monkeypatch, handlers):
    from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore

    monkeypatch.chdir(tmp_path)
    tracker = Tracker(_cfg(tmp_path), tmp_path, "sft")
    tracker.log_metrics({"train/loss": 0.5}, 1)
    log = _signal_inside(monkeypatch, SqlAlchemyStore, "_update_latest_metrics_if_necessary")
    with pytest.raises(Interrupted) as stop:
        tracker.flush()
    assert stop.value.signum == signal.SIGINT and stops.STOPS == [stop.value]
    assert log == ["signalled", "write done"]  # the write was not cut
    assert tracker._buffer == []
    t0 = time.monotonic()
    tracker.close("KILLED")  # as the stage's `with` does on the way out: no lock left to wait for
    assert time.monotonic() - t0 < 5
    run = tracker_client(tmp_path).get_run(tracker.run_id)
    assert run.info.status == "KILLED"
    assert [m.value for m in tracker_client(tmp_path).get_metric_history(tracker.run_id, "train/loss")] == [0.5]


def test_a_second_signal_stops_at_once(tmp_path, monkeypatch, handlers):
    from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore

    monkeypatch.chdir(tmp_path)
    tracker = Tracker(_cfg(tmp_path), tmp_path, "sft")
    tracker.log_metrics({"train/loss": 0.5}, 1)
    log = _signal_inside(monkeypatch, SqlAlchemyStore, "_update_latest_metrics_if_necessary", signal.SIGTERM, times=2)
    with pytest.raises(Interrupted) as stop:
        tracker.flush()
    assert log == []  # the user insisted: the write did not wait
    assert stop.value.signum == signal.SIGTERM and len(stops.STOPS) == 2 and not stops.pending()


def test_a_stop_while_the_run_starts_ends_it_killed(tmp_path, monkeypatch, handlers):
    from mlflow.tracking import MlflowClient

    monkeypatch.chdir(tmp_path)
    _signal_inside(monkeypatch, MlflowClient, "create_run")
    with pytest.raises(Interrupted):
        Tracker(_cfg(tmp_path), tmp_path, "sft")
    client = tracker_client(tmp_path)
    runs = client.search_runs([client.get_experiment_by_name("rlinf").experiment_id])
    assert [r.info.status for r in runs] == ["KILLED"]  # not left RUNNING for a later run to clean up


def test_deferred_blocks_nest_and_raise_when_the_outermost_ends(handlers):
    order = []
    with pytest.raises(Interrupted):
        with stops.deferred():
            with stops.deferred():
                os.kill(os.getpid(), signal.SIGINT)
                time.sleep(0.01)
                order.append("inner")
            assert stops.pending()
            order.append("outer")
    assert order == ["inner", "outer"] and not stops.pending()


def test_a_block_that_fails_with_a_stop_held_still_stops(handlers):
    with pytest.raises(Interrupted) as stop:
        with stops.deferred():
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.01)
            raise ValueError("the write failed")
    assert isinstance(stop.value.__context__, ValueError)


def tracker_client(tmp_path):
    from mlflow.tracking import MlflowClient

    from rlinf_cli.tracking import default_uri

    return MlflowClient(default_uri(tmp_path / "runs"))


class _StoppedInDel:
    """Takes the signal inside its __del__, where Python drops any exception ("Exception ignored in")."""

    def __del__(self):
        os.kill(os.getpid(), signal.SIGINT)
        for _ in range(1000):  # the handler runs at one of these bytecodes, inside __del__
            time.sleep(0.001)


def test_a_stop_python_drops_in_a_finalizer_is_delivered_again(handlers, capsys):
    """`rlinf eval` ran on after SIGINT: the stop was raised in SQLAlchemy's weakref callback and
    dropped. It is sent again, lands in ordinary code, and counts as one stop, printed by no one."""
    with pytest.raises(Interrupted) as caught:
        obj = _StoppedInDel()
        del obj  # __del__ runs here: the stop raised inside it is dropped by Python
        for _ in range(1000):
            time.sleep(0.001)
        pytest.fail("the stop dropped in __del__ was not delivered again")
    assert caught.value.signum == signal.SIGINT and stops.STOPS == [caught.value]
    assert "Exception ignored" not in capsys.readouterr().err
