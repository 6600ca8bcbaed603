"""A new embedded MLflow store starts as a copy of a cached empty one (tracking_store.new_client):
the copy must be the store MLflow would have made, and a bad copy must not break tracking."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from rlinf_cli import tracking_store


def _schema(db: Path) -> list[tuple[str, str]]:
    con = sqlite3.connect(db)
    try:
        return sorted(con.execute("SELECT name, sql FROM sqlite_master WHERE sql IS NOT NULL").fetchall())
    finally:
        con.close()


def _rows(db: Path, sql: str) -> list[tuple]:
    con = sqlite3.connect(db)
    try:
        return con.execute(sql).fetchall()
    finally:
        con.close()


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("RLINF_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


def _store(root: Path, monkeypatch) -> tuple[object, Path]:
    root.mkdir(parents=True)
    monkeypatch.chdir(root)  # MLflow places the default experiment's artifacts under the working directory
    db = root / "mlflow.db"
    return tracking_store.new_client(f"sqlite:///{db}", db), db


def test_second_store_is_the_cached_copy_and_equals_a_migrated_one(tmp_path, cache, monkeypatch):
    import mlflow.store.db.utils as db_utils

    first, db_a = _store(tmp_path / "a", monkeypatch)
    template = tracking_store.template_path()
    assert template is not None and template.parent == cache and template.is_file()
    assert _rows(template, "SELECT COUNT(*) FROM experiments") == [(0,)]  # no default experiment in the copy
    assert _rows(template, "SELECT COUNT(*) FROM runs") == [(0,)]

    def no_migrations(*_a, **_k):
        raise AssertionError("a store made from the cached copy ran MLflow's migrations")

    monkeypatch.setattr(db_utils, "_initialize_tables", no_migrations)
    second, db_b = _store(tmp_path / "b", monkeypatch)
    assert _schema(db_b) == _schema(db_a)
    assert _rows(db_b, "SELECT * FROM alembic_version") == _rows(db_a, "SELECT * FROM alembic_version")
    default = second.get_experiment("0")
    assert default.name == "Default" and default.artifact_location == str(tmp_path / "b" / "mlruns" / "0")
    for client, root in ((first, tmp_path / "a"), (second, tmp_path / "b")):
        exp = client.create_experiment("rlinf", artifact_location=(root / "art").as_uri())
        assert exp == "1"  # the same ids as in a store MLflow made itself
        run = client.create_run(exp)
        client.log_metric(run.info.run_id, "loss", 0.5, step=3)
        assert [(m.value, m.step) for m in client.get_metric_history(run.info.run_id, "loss")] == [(0.5, 3)]


def test_a_damaged_cached_copy_is_replaced_and_tracking_works(tmp_path, cache, monkeypatch):
    template = tracking_store.template_path()
    template.parent.mkdir(parents=True)
    template.write_bytes(b"not a sqlite file" * 100)
    client, db = _store(tmp_path / "a", monkeypatch)
    run = client.create_run(client.create_experiment("rlinf"))
    client.log_metric(run.info.run_id, "x", 1.0)
    assert _rows(template, "SELECT COUNT(*) FROM experiments") == [(0,)]  # a good copy now
    assert _schema(template) == _schema(db)


def test_an_existing_store_is_opened_as_it_is(tmp_path, cache, monkeypatch):
    client, db = _store(tmp_path / "a", monkeypatch)
    exp = client.create_experiment("kept")
    again = tracking_store.new_client(f"sqlite:///{db}", db)
    assert again.get_experiment_by_name("kept").experiment_id == exp


def test_a_copy_that_fails_half_way_leaves_no_store_behind(tmp_path, cache, monkeypatch):
    import errno

    _store(tmp_path / "a", monkeypatch)  # the cached copy exists now

    def full_disk(src, dst):
        Path(dst).write_bytes(Path(src).read_bytes()[:100])
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(tracking_store.shutil, "copyfile", full_disk)
    root = tmp_path / "b"
    with pytest.raises(OSError):
        _store(root, monkeypatch)
    assert list(root.iterdir()) == []  # neither a half store nor its temporary copy
