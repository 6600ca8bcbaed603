"""The embedded MLflow store's bootstrap: a new sqlite store made fast and never left half-made.

:mod:`rlinf_cli.tracking` logs runs; this module gives it a client on a store that exists whole:
a new store starts as a copy of a cached empty one of this MLflow version (MLflow's own creation
runs ~70 migrations, 1.5-2 s), or is built beside its final name and renamed into place, and its
failures read as one line with what to do (:func:`store_error`).
"""

from __future__ import annotations

import os
import shutil
import sqlite3
from pathlib import Path
from typing import Any

from rlinf_cli.errors import UserError


def new_client(uri: str, db: Path | None) -> Any:
    """The MLflow client; a new sqlite store starts as a copy of an empty one of this MLflow version.

    MLflow creates a sqlite store by running its whole migration history (~70 Alembic scripts,
    1.5-2 s on this project's CPU), once per runs directory; each new ``runs_dir`` (every test,
    every fresh project) paid it. The first creation keeps its empty result (schema and version
    rows, without the default experiment, which MLflow adds when it is missing, with this
    store's own paths and times) in the cache; later ones copy it and MLflow only checks it.
    Any trouble with the cached copy: the store is made the usual way."""
    from mlflow.tracking import MlflowClient

    if db is None or db.exists():
        return MlflowClient(tracking_uri=uri)
    template = template_path()
    if template is not None and _is_empty_store(template):
        tmp = db.with_name(f".{db.name}.{os.getpid()}.new")
        try:  # copied aside and renamed: a failed copy (a full disk) never leaves a broken store behind
            shutil.copyfile(template, tmp)
            os.replace(tmp, db)
        finally:
            tmp.unlink(missing_ok=True)
        try:
            return MlflowClient(tracking_uri=uri)  # MLflow checks the schema version and adds the default experiment
        except Exception:
            # whatever was wrong with the copy, neither it nor this store (empty, just made) is kept:
            # the next run makes both the usual way
            template.unlink(missing_ok=True)
            db.unlink(missing_ok=True)
            raise
    # No cached copy: MLflow's migrations build the store beside its final name, and only a whole
    # store is renamed into place. Built in place, a failure half-way (a full disk) left a file
    # every later run tripped over ("table ... already exists") until someone moved it aside.
    fresh = _build_store_aside(db)
    try:
        if template is not None:
            _save_template(fresh, template)
        os.replace(fresh, db)
    finally:
        _remove_sqlite(fresh)
    return MlflowClient(tracking_uri=uri)  # MLflow checks the schema version and adds the default experiment


def _build_store_aside(db: Path) -> Path:
    """A new, empty store (MLflow's whole migration history) in a file beside ``db`` that no other
    process opens; on any failure nothing of it is left."""
    import sqlalchemy

    from mlflow.store.db.utils import _initialize_tables

    fresh = db.with_name(f".{db.name}.{os.getpid()}.new")
    _remove_sqlite(fresh)
    engine = sqlalchemy.create_engine(f"sqlite:///{fresh}")
    try:
        _initialize_tables(engine)
    except BaseException:
        engine.dispose()
        _remove_sqlite(fresh)
        raise
    engine.dispose()
    return fresh


def _remove_sqlite(path: Path) -> None:
    """A sqlite file and the journal files sqlite keeps beside it."""
    for p in (path, *(path.with_name(path.name + s) for s in ("-journal", "-wal", "-shm"))):
        p.unlink(missing_ok=True)


def template_path() -> Path | None:
    try:
        import mlflow

        root = os.environ.get("RLINF_CACHE_DIR") or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "rlinf"
    except (ImportError, RuntimeError):  # no home directory: no cache
        return None
    return Path(root) / f"mlflow-{mlflow.__version__}-empty.db"


def _is_empty_store(path: Path) -> bool:
    """A sqlite file with a schema version and neither experiments nor runs (a good template)."""
    if not path.is_file():
        return False
    try:
        con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
        try:
            versions = con.execute("SELECT version_num FROM alembic_version").fetchall()
            (exps,) = con.execute("SELECT COUNT(*) FROM experiments").fetchone()
            (runs,) = con.execute("SELECT COUNT(*) FROM runs").fetchone()
        finally:
            con.close()
    except sqlite3.Error:
        return False
    return len(versions) == 1 and exps == 0 and runs == 0


def _save_template(db: Path, template: Path) -> None:
    """Keep a just-created, still empty store (less its default experiment) as the template."""
    tmp = template.with_name(f".{template.name}.{os.getpid()}.tmp")
    try:
        template.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(db, tmp)
        con = sqlite3.connect(tmp)
        try:
            with con:
                con.execute("DELETE FROM experiment_tags WHERE experiment_id = 0")
                con.execute("DELETE FROM experiments WHERE experiment_id = 0")
        finally:
            con.close()
        if _is_empty_store(tmp):
            os.replace(tmp, template)
    except (OSError, sqlite3.Error):  # an unwritable cache costs only the time it would have saved
        pass
    finally:
        tmp.unlink(missing_ok=True)


def sqlite_path(uri: str) -> Path | None:
    return Path(uri[len("sqlite:///"):]) if uri.startswith("sqlite:///") else None


def check_writable(db: Path, uri: str) -> None:
    """sqlite fails late and vaguely on a read-only file or directory: say it first."""

    if db.exists() and not os.access(db, os.W_OK):
        raise UserError(f"the MLflow store {db} is read-only; make it writable, point tracking.uri elsewhere, "
                        f"or run with tracking.enabled=false")
    if not os.access(db.parent, os.W_OK):
        raise UserError(f"cannot write in {db.parent} (the MLflow store {db.name} and its journal live there): "
                        f"permission denied; choose a writable runs_dir=... or tracking.enabled=false")


def store_error(uri: str, exc: BaseException) -> str:
    """One line for a failure of the tracking store, with what to do about it."""
    text = " ".join(str(exc).split())
    low = text.lower()
    if "readonly" in low or "read-only" in low:
        why = "it is read-only; make it writable"
    elif "disk i/o error" in low or "database or disk is full" in low or "no space" in low or "file too large" in low:
        why = "the disk is full or a file-size limit was hit (disk I/O error); free space"
    elif "unable to open database" in low or "permission denied" in low:
        why = "it cannot be opened (permission denied?); check the path's permissions"
    elif "migration" in low or "alembic" in low or "no such table" in low or "no such column" in low \
            or "already exists" in low:
        why = ("its schema is incomplete (an interrupted upgrade or creation by an older rlinf); move the file "
               "aside (e.g. `mv mlflow.db mlflow.db.bad`) to start a fresh store")
    else:
        why = f"{type(exc).__name__}: {text[:200]}"
    return f"tracking store {uri}: {why}; or run with tracking.enabled=false (metrics.jsonl is written either way)"
