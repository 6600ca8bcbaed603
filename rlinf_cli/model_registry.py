"""Opt-in MLflow model registry for evaluated checkpoints (``rlinf eval ... register.name=NAME``).

A checkpoint whose evaluation met the bar (``register.metric >= register.threshold``) is logged
as the eval run's ``model/`` artifacts and registered as a new version of the registered model
``NAME``, with the eval table as its description and the numbers as tags, so teams can promote
policies with MLflow's aliases and stages the way they promote other models. A checkpoint below
the bar is not registered; the result says why.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rlinf_cli.errors import UserError


def check_options(cfg: Any, checkpoint: str) -> None:
    """Refuse a registration that cannot happen before any episode runs."""
    reg = cfg.get("register") or {}
    if not reg.get("name"):
        return
    if not cfg.tracking.enabled:
        raise UserError("register.name needs MLflow: drop tracking.enabled=false (or register.name)")
    if checkpoint in ("random", "expert") or not Path(checkpoint).is_dir():
        raise UserError(f"register.name registers a checkpoint directory, not '{checkpoint}'")


def register(tracker: Any, checkpoint: str, summary: dict[str, float], cfg: Any, table_text: str = "") -> dict[str, Any]:
    """Register ``checkpoint`` if it met the bar; returns what happened (for result.json)."""
    from mlflow.exceptions import MlflowException

    reg = cfg.register
    name, metric, threshold = str(reg.name), str(reg.metric), float(reg.threshold)
    value = summary.get(metric)
    if value is None:
        raise UserError(f"register.metric '{metric}' is not an eval number here; choose one of {sorted(summary)}")
    out: dict[str, Any] = {"name": name, "metric": metric, "value": float(value), "threshold": threshold}
    if value < threshold:
        return {**out, "registered": False, "reason": f"{metric} {value:.3f} < {threshold}"}
    client, run_id = tracker.client, tracker.run_id
    client.log_artifacts(run_id, str(checkpoint), "model")
    try:
        client.create_registered_model(name, description="rlinf policy checkpoints (registered by `rlinf eval`)")
    except MlflowException as exc:
        if "RESOURCE_ALREADY_EXISTS" not in str(exc.error_code) and "already exists" not in str(exc):
            raise
    source = client.get_run(run_id).info.artifact_uri.rstrip("/") + "/model"
    tags = {f"eval.{k}": f"{v:.6g}" for k, v in summary.items()}
    tags.update({"rlinf.checkpoint": str(Path(checkpoint).resolve()), "rlinf.bar": f"{metric} >= {threshold}"})
    version = client.create_model_version(name, source, run_id=run_id, tags=tags,
                                          description=f"```\n{table_text}\n```" if table_text else None)
    return {**out, "registered": True, "version": int(version.version), "source": source}
