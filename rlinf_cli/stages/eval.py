"""`rlinf eval`: how good a checkpoint (or random / expert) is on held-out seeds, for any simulator
or text task: a table, JSON on stdout and in ``result.json``, and MLflow."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from rlinf_cli.stages import common


def run(cfg: Any) -> dict[str, Any]:
    from rlinf_cli import collectors
    from rlinf_cli.config import flatten
    from rlinf_cli.progress import Progress

    source = str(cfg.checkpoint)
    label = Path(source).name if source not in ("random", "expert") else source
    ctx = common.start(cfg, "eval", f"{cfg.sim.name}-{label}")
    collector = collectors.make(cfg, ctx)
    policy = source if source in ("random", "expert") else collector.policy(source)
    n, text = int(cfg.episodes), cfg.get("text") or {}
    with ctx.track(cfg, {**common.plugin_tags(cfg), "rlinf.checkpoint": source,
                         "rlinf.modality": collector.modality}) as tracker, \
            Progress(ctx.log, "eval", n, "episodes", enabled=bool(cfg.progress)) as progress:
        tracker.log_params(flatten(cfg))
        ev = collector.evaluate(policy, n, int(cfg.seed), bool(cfg.deterministic), label=label,
                                on_batch=progress.update, pass_k=int(text.get("pass_k", 0)),
                                batch=int(text.get("batch", 64)), examples=int(text.get("examples", 8)))
        progress.close()
        tracker.log_metrics(ev.metrics, 0)
        result = {"stage": "eval", "modality": collector.modality, "checkpoint": source, "run_dir": str(ctx.run_dir),
                  "seconds": round(time.time() - ctx.started, 2), "eval": ev.summary, **ev.extra,
                  "mlflow_run_id": tracker.run_id}
        table = collector.table(ev.rows, f"rlinf eval: {collector.label} (seeds {cfg.seed}..{int(cfg.seed) + n - 1})")
        common.write_result(ctx, tracker, result, table)
        if cfg.output:
            Path(cfg.output).parent.mkdir(parents=True, exist_ok=True)
            Path(cfg.output).write_text(json.dumps(result, indent=2))
        ctx.console.print(table)
        if ev.examples is not None:
            ctx.console.print(ev.examples)
        ctx.console.print_json(json.dumps({"checkpoint": source, **ev.summary,
                                           **({"per_task": ev.extra["per_task"]} if "per_task" in ev.extra else {})}))
    return result
