"""Run tracking: MLflow (embedded sqlite store by default) plus a local ``metrics.jsonl``.

MLflow is imported only when a run starts. Metrics are buffered and written with
``log_batch``: one call per metric is ~100x slower on the sqlite store.
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import math
import subprocess
import time
from collections import Counter
from pathlib import Path
from typing import Any, Mapping

from rlinf_cli import stops
from rlinf_cli.errors import UserError
from rlinf_cli.locks import abandoned, locked
from rlinf_cli.tracking_store import check_writable, new_client, sqlite_path, store_error

_FLUSH_SECONDS = 5.0


def default_uri(runs_dir: Path) -> str:
    return f"sqlite:///{(runs_dir / 'mlflow.db').resolve()}"


def git_revision(cwd: Path | None = None) -> str | None:
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=cwd, capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() or None if out.returncode == 0 else None


class Tracker:
    """One stage run. Use as a context manager; the run ends FINISHED, FAILED or KILLED.

    ``metrics.jsonl`` in the run directory is the record; MLflow mirrors it. A run resumed from
    a checkpoint (``resume_step``) first cuts ``metrics.jsonl`` back to the checkpoint, then makes
    the MLflow run match it again (see :meth:`_sync_resumed`): points a killed process never sent
    are sent, and points it sent after the checkpoint (logged again now) are dropped.
    """

    def __init__(self, cfg: Any, run_dir: Path, stage: str, tags: Mapping[str, str] | None = None,
                 resume_run_id: str | None = None, resume_step: int | None = None):
        self.run_dir = run_dir
        self.history: list[dict[str, float]] = []
        if resume_step is not None:
            self.history = _truncate_metrics(run_dir / "metrics.jsonl", resume_step)
        self.client = None
        self.run_id: str | None = None
        self.resumed = False
        self.notes: list[str] = []  # what the caller should tell the user (a rebuilt MLflow run)
        self._buffer: list[Any] = []
        self._last_flush = time.monotonic()
        self._flush_s = float(cfg.tracking.get("flush_s", _FLUSH_SECONDS))
        if cfg.tracking.enabled:
            with stops.deferred():  # seconds at most; a stop cut inside a store write can leave it locked
                self._start_mlflow(cfg, run_dir, stage, dict(tags or {}), resume_run_id if resume_step is not None else None)
                if stops.pending() and self.client is not None:  # stopped while starting: no caller will close it
                    self.client.set_terminated(self.run_id, status="KILLED")
        self.metrics_file = _open_append(run_dir / "metrics.jsonl")

    # -- mlflow ----------------------------------------------------------------------------
    def _start_mlflow(self, cfg: Any, run_dir: Path, stage: str, tags: dict[str, str], resume_run_id: str | None) -> None:
        from mlflow.tracking import MlflowClient

        for name in ("alembic", "mlflow", "sqlalchemy"):  # after the import: mlflow sets its own levels then
            logging.getLogger(name).setLevel(logging.ERROR)

        runs_dir = Path(cfg.runs_dir)
        uri = cfg.tracking.uri or default_uri(runs_dir)
        db = sqlite_path(uri)
        try:
            if db is not None:
                db.parent.mkdir(parents=True, exist_ok=True)
                check_writable(db, uri)
            # Creating (migrating) a sqlite store is not safe from two processes at once: runs
            # started together take turns here. Later writes are single transactions.
            with locked(db.with_name(f".{db.name}.lock")) if db is not None else contextlib.nullcontext():
                client = new_client(uri, db)
                if db is not None:  # an embedded store: its runs' directories are on this machine
                    self.notes.extend(_end_abandoned_runs(client))
                if resume_run_id is not None and self._resume(client, resume_run_id):
                    return
                exp_id = _experiment_id(client, cfg, runs_dir)
                rev = git_revision()
                tags = {"rlinf.stage": stage, "rlinf.run_dir": str(run_dir.resolve()), **tags}
                if rev:
                    tags["mlflow.source.git.commit"] = rev
                    tags["git.revision"] = rev
                run = client.create_run(exp_id, run_name=cfg.tracking.run_name or run_dir.name, tags=tags)
        except UserError:
            raise
        except Exception as exc:  # MlflowException, SQLAlchemy and OS errors alike: one line
            raise UserError(store_error(uri, exc)) from exc
        self.client = client
        self.run_id = run.info.run_id

    def _resume(self, client: Any, run_id: str) -> bool:
        """Continue MLflow run ``run_id`` if the store still has it (and make it match
        ``metrics.jsonl``); False: it is gone, start a new run."""
        from mlflow.exceptions import MlflowException

        try:
            run = client.get_run(run_id)
        except MlflowException:
            return False
        if run.info.lifecycle_stage == "deleted":
            return False
        self.client, self.run_id, self.resumed = client, run_id, True
        self._sync_resumed(run)
        client.update_run(self.run_id, status="RUNNING")
        return True

    def _sync_resumed(self, run: Any) -> None:
        """Make the MLflow history equal ``metrics.jsonl`` (already cut back to the checkpoint)."""
        from mlflow.entities import Metric

        want = Counter(_point(k, v, row["step"]) for row in self.history for k, v in row.items() if k != "step")
        have: Counter = Counter()
        for key in run.data.metrics:
            have.update(_point(key, m.value, m.step) for m in self.client.get_metric_history(self.run_id, key))
        if not have - want:  # only points missing (a kill before the buffer was flushed): send them
            now = int(time.time() * 1000)
            self._buffer.extend(Metric(k, v, now, step) for (k, v, step), n in (want - have).items() for _ in range(n))
            self.flush()
            return
        # The killed process sent points past the checkpoint. MLflow cannot delete points, so the
        # run is rebuilt from metrics.jsonl under a new id, with the old run's params and tags,
        # and the old one is deleted (recoverable with `mlflow gc`-less restore until purged).
        client, old = self.client, run
        tags = {k: v for k, v in old.data.tags.items() if not k.startswith("mlflow.")}
        tags["rlinf.rebuilt_from_run"] = old.info.run_id
        new = client.create_run(old.info.experiment_id, run_name=old.info.run_name, tags=tags)
        self.run_id = new.info.run_id
        _log_params(client, self.run_id, old.data.params)
        now = int(time.time() * 1000)
        self._buffer.extend(Metric(k, v, now, step) for (k, v, step), n in want.items() for _ in range(n))
        self.flush()
        client.delete_run(old.info.run_id)
        self.notes.append(f"tracking: MLflow run {old.info.run_id} held points past the checkpoint; it was rebuilt "
                          f"from metrics.jsonl as run {self.run_id} (the old one is marked deleted)")

    def log_params(self, params: Mapping[str, Any]) -> None:
        if self.client is None:
            return
        with stops.deferred():
            self._write_params(params)

    def _write_params(self, params: Mapping[str, Any]) -> None:
        values = {k: str(v)[:6000] for k, v in params.items()}
        if self.resumed:  # MLflow params are immutable: a resumed run records what changed as tags
            logged = self.client.get_run(self.run_id).data.params
            for k, v in values.items():
                if k in logged and logged[k] != v:
                    self.client.set_tag(self.run_id, f"resume.{k}", v)
            values = {k: v for k, v in values.items() if k not in logged}
        _log_params(self.client, self.run_id, values)

    def log_metrics(self, metrics: Mapping[str, float], step: int) -> None:
        row = {"step": step, **{k: float(v) for k, v in metrics.items()}}
        self.history.append(row)
        try:
            self.metrics_file.write(json.dumps(row) + "\n")
            self.metrics_file.flush()
        except OSError as exc:
            raise UserError(f"cannot write {self.run_dir / 'metrics.jsonl'}: {exc.strerror}{_disk_hint(exc)}") from exc
        if self.client is None:
            return
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        self._buffer.extend(Metric(k, float(v), now, step) for k, v in metrics.items())
        if time.monotonic() - self._last_flush > self._flush_s:
            self.flush()

    def flush(self) -> None:
        if self.client is None or not self._buffer:
            return
        with stops.deferred():  # a stop cut inside SQLAlchemy can leave sqlite's write lock held (stops.py)
            try:
                for i in range(0, len(self._buffer), 1000):
                    self.client.log_batch(self.run_id, metrics=self._buffer[i:i + 1000])
            except Exception as exc:
                raise UserError(store_error(self.client.tracking_uri, exc)) from exc
            self._buffer.clear()
            self._last_flush = time.monotonic()

    def log_artifact(self, path: Path, artifact_path: str | None = None) -> None:
        if self.client is not None and Path(path).exists():
            self.client.log_artifact(self.run_id, str(path), artifact_path)

    def close(self, status: str = "FINISHED") -> None:
        self.metrics_file.close()
        if self.client is not None:
            with stops.deferred():  # the run's last points and its status are written whole
                self.flush()
                self.client.set_terminated(self.run_id, status=status)
                self.client = None

    def __enter__(self) -> "Tracker":
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        status = "FINISHED" if exc_type is None else "KILLED" if issubclass(exc_type, KeyboardInterrupt) else "FAILED"
        try:
            self.close(status)
        except Exception:
            if exc_type is None:
                raise


def _end_abandoned_runs(client: Any) -> list[str]:
    """Mark KILLED the runs a process left RUNNING when it was killed (kill -9, an out-of-memory
    kill, a machine that went down): a run whose directory's lock no process holds any more.
    Called when a run starts in the same store; returns a note per run marked."""
    from mlflow.entities import ViewType


    try:
        ids = [e.experiment_id for e in client.search_experiments(view_type=ViewType.ALL)]
        runs = client.search_runs(ids, "attributes.status = 'RUNNING'", max_results=1000) if ids else []
    except Exception:  # only housekeeping: never a reason to refuse the new run
        return []
    notes = []
    for run in runs:
        run_dir = run.data.tags.get("rlinf.run_dir")
        if not run_dir or not abandoned(Path(run_dir) / ".lock"):
            continue
        metrics = Path(run_dir) / "metrics.jsonl"  # its last write is when the run last did anything
        end = max(int(metrics.stat().st_mtime * 1000), run.info.start_time or 0) if metrics.exists() else None
        client.set_tag(run.info.run_id, "rlinf.ended", "marked KILLED by a later run: its process ended without "
                                                     "closing it (kill -9?)")
        client.set_terminated(run.info.run_id, status="KILLED", end_time=end)
        notes.append(f"tracking: marked KILLED the MLflow run {run.info.run_id} that a process left RUNNING when it "
                     f"died (kill -9?)")
    return notes


def _log_params(client: Any, run_id: str, params: Mapping[str, str]) -> None:
    from mlflow.entities import Param

    items = [Param(k, v) for k, v in params.items()]
    for i in range(0, len(items), 100):  # MLflow takes at most 100 params per batch
        client.log_batch(run_id, params=items[i:i + 100])


def _truncate_metrics(path: Path, last_step: int) -> list[dict[str, float]]:
    """Drop rows logged after the checkpoint a run resumes from (they will be logged again),
    and a last line the killed run left half-written; returns the rows kept."""
    if not path.exists():
        return []
    keep, rows = [], []
    for line in path.read_text().splitlines():
        try:
            row = json.loads(line)
        except ValueError:
            continue
        if isinstance(row, dict) and row.get("step", 0) <= last_step:
            keep.append(line)
            rows.append(row)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text("".join(line + "\n" for line in keep))
    tmp.replace(path)  # atomic: an interrupted resume leaves the old file whole
    return rows


def _point(key: str, value: float, step: Any) -> tuple[str, Any, int]:
    """A metric point as a comparable tuple (NaN equals NaN here)."""
    v = float(value)
    return key, ("nan" if math.isnan(v) else v), int(step)


def _experiment_id(client: Any, cfg: Any, runs_dir: Path) -> str:
    from mlflow.exceptions import MlflowException

    exp = client.get_experiment_by_name(cfg.tracking.experiment)
    if exp is not None:
        return exp.experiment_id
    artifact_root = (runs_dir / "mlartifacts").resolve().as_uri() if cfg.tracking.uri is None else None
    try:
        return client.create_experiment(cfg.tracking.experiment, artifact_location=artifact_root)
    except MlflowException:  # created meanwhile by a run on another store client
        return client.get_experiment_by_name(cfg.tracking.experiment).experiment_id


def _disk_hint(exc: OSError) -> str:
    return " (disk full or file-size limit)" if exc.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG) else ""


def _open_append(path: Path) -> Any:
    try:
        return path.open("a")
    except OSError as exc:
        raise UserError(f"cannot write {path}: {exc.strerror}; choose a writable runs_dir=... or run_dir=...") from exc


def plot_curve(history: list[dict[str, float]], x: str, ys: list[str], path: Path, title: str) -> Path | None:
    """Learning-curve PNG of the given metrics against ``x``; None if there is nothing to plot."""
    rows = [r for r in history if x in r]
    present = [y for y in ys if any(y in r for r in rows)]
    if not present:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(present), figsize=(5 * len(present), 3.5), squeeze=False)
    for ax, y in zip(axes[0], present):
        pts = [(r[x], r[y]) for r in rows if y in r]
        ax.plot([p[0] for p in pts], [p[1] for p in pts])
        ax.set_xlabel(x)
        ax.set_ylabel(y)
        ax.grid(alpha=0.3)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path
