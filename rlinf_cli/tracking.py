"""Run tracking: MLflow (embedded sqlite store by default) plus a local ``metrics.jsonl``.

MLflow is imported only when a run starts. Metrics are buffered and written with
``log_batch``: one call per metric is ~100x slower on the sqlite store.
"""

from __future__ import annotations

import json
import logging
import subprocess
import time
from pathlib import Path
from typing import Any, Mapping

from rlinf_cli.errors import UserError

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
    """One stage run. Use as a context manager; the run ends FINISHED, FAILED or KILLED."""

    def __init__(self, cfg: Any, run_dir: Path, stage: str, tags: Mapping[str, str] | None = None,
                 resume_run_id: str | None = None, resume_step: int | None = None):
        self.run_dir = run_dir
        if resume_step is not None:
            _truncate_metrics(run_dir / "metrics.jsonl", resume_step)
        self.metrics_file = (run_dir / "metrics.jsonl").open("a")
        self.history: list[dict[str, float]] = []
        self.client = None
        self.run_id: str | None = None
        self.resumed = False
        self._buffer: list[Any] = []
        self._last_flush = time.monotonic()
        if cfg.tracking.enabled:
            self._start_mlflow(cfg, run_dir, stage, dict(tags or {}), resume_run_id)

    # -- mlflow ----------------------------------------------------------------------------
    def _start_mlflow(self, cfg: Any, run_dir: Path, stage: str, tags: dict[str, str], resume_run_id: str | None) -> None:
        for name in ("alembic", "mlflow"):
            logging.getLogger(name).setLevel(logging.WARNING)
        from mlflow.exceptions import MlflowException
        from mlflow.tracking import MlflowClient

        runs_dir = Path(cfg.runs_dir)
        runs_dir.mkdir(parents=True, exist_ok=True)
        uri = cfg.tracking.uri or default_uri(runs_dir)
        try:
            client = MlflowClient(tracking_uri=uri)
            if resume_run_id is not None:  # a resumed run continues its MLflow run when the store has it
                try:
                    client.update_run(resume_run_id, status="RUNNING")
                    self.client, self.run_id, self.resumed = client, resume_run_id, True
                    return
                except MlflowException:
                    pass
            exp = client.get_experiment_by_name(cfg.tracking.experiment)
            if exp is None:
                artifact_root = (runs_dir / "mlartifacts").resolve().as_uri() if cfg.tracking.uri is None else None
                try:
                    exp_id = client.create_experiment(cfg.tracking.experiment, artifact_location=artifact_root)
                except MlflowException:  # created meanwhile by a concurrent run
                    exp_id = client.get_experiment_by_name(cfg.tracking.experiment).experiment_id
            else:
                exp_id = exp.experiment_id
            rev = git_revision()
            tags = {"rlinf.stage": stage, "rlinf.run_dir": str(run_dir.resolve()), **tags}
            if rev:
                tags["mlflow.source.git.commit"] = rev
                tags["git.revision"] = rev
            run = client.create_run(exp_id, run_name=cfg.tracking.run_name or run_dir.name, tags=tags)
        except MlflowException as exc:
            raise UserError(f"tracking.uri '{uri}': {str(exc).splitlines()[0]} (tracking.enabled=false runs without MLflow)") from exc
        self.client = client
        self.run_id = run.info.run_id

    def log_params(self, params: Mapping[str, Any]) -> None:
        if self.client is None:
            return
        from mlflow.entities import Param

        values = {k: str(v)[:6000] for k, v in params.items()}
        if self.resumed:  # MLflow params are immutable: a resumed run records what changed as tags
            logged = self.client.get_run(self.run_id).data.params
            for k, v in values.items():
                if k in logged and logged[k] != v:
                    self.client.set_tag(self.run_id, f"resume.{k}", v)
            values = {k: v for k, v in values.items() if k not in logged}
        items = [Param(k, v) for k, v in values.items()]
        for i in range(0, len(items), 100):
            self.client.log_batch(self.run_id, params=items[i:i + 100])

    def log_metrics(self, metrics: Mapping[str, float], step: int) -> None:
        row = {"step": step, **{k: float(v) for k, v in metrics.items()}}
        self.history.append(row)
        self.metrics_file.write(json.dumps(row) + "\n")
        self.metrics_file.flush()
        if self.client is None:
            return
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        self._buffer.extend(Metric(k, float(v), now, step) for k, v in metrics.items())
        if time.monotonic() - self._last_flush > _FLUSH_SECONDS:
            self.flush()

    def flush(self) -> None:
        if self.client is None or not self._buffer:
            return
        for i in range(0, len(self._buffer), 1000):
            self.client.log_batch(self.run_id, metrics=self._buffer[i:i + 1000])
        self._buffer.clear()
        self._last_flush = time.monotonic()

    def log_artifact(self, path: Path, artifact_path: str | None = None) -> None:
        if self.client is not None and Path(path).exists():
            self.client.log_artifact(self.run_id, str(path), artifact_path)

    def set_tags(self, tags: Mapping[str, str]) -> None:
        if self.client is not None:
            for k, v in tags.items():
                self.client.set_tag(self.run_id, k, str(v))

    def close(self, status: str = "FINISHED") -> None:
        self.metrics_file.close()
        if self.client is not None:
            self.flush()
            self.client.set_terminated(self.run_id, status=status)
            self.client = None

    def __enter__(self) -> "Tracker":
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if exc_type is None:
            status = "FINISHED"
        elif issubclass(exc_type, KeyboardInterrupt):
            status = "KILLED"
        else:
            status = "FAILED"
        try:
            self.close(status)
        except Exception:
            if exc_type is None:
                raise


def _truncate_metrics(path: Path, last_step: int) -> None:
    """Drop rows logged after the checkpoint a run resumes from (they will be logged again),
    and a last line the killed run left half-written."""
    if not path.exists():
        return
    keep = []
    for line in path.read_text().splitlines():
        try:
            row = json.loads(line)
        except ValueError:
            continue
        if isinstance(row, dict) and row.get("step", 0) <= last_step:
            keep.append(line)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text("".join(line + "\n" for line in keep))
    tmp.replace(path)  # atomic: an interrupted resume leaves the old file whole


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
