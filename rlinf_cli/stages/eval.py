"""`rlinf eval`: how good a checkpoint (or random / expert) is on held-out seeds, for any simulator
or text task: a table, JSON on stdout and in ``result.json``, and MLflow."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from rlinf_cli import model_registry
from rlinf_cli.config import flatten
from rlinf_cli.progress import Progress
from rlinf_cli.stages import common


def run(cfg: Any) -> dict[str, Any]:
    try:
        return _run(cfg)
    except KeyboardInterrupt as exc:  # SIGINT or SIGTERM
        common.stopped(exc, "no result was written (an evaluation does not resume: run the command again)")
        raise


def _run(cfg: Any) -> dict[str, Any]:
    from rlinf_cli import collectors


    source = str(cfg.checkpoint)
    model_registry.check_options(cfg, source)
    label = Path(source).name if source not in ("random", "expert") else source
    ctx = common.start(cfg, "eval", f"{cfg.sim.name}-{label}")
    world = collectors.make(cfg, ctx)
    video = int(cfg.get("video", 0) or 0)
    world.evaluator.check_video(video, int(cfg.get("video_size", 256)))  # cannot render: say so before any episode
    policy = source if source in ("random", "expert") else world.policies.policy(source)
    n, text = int(cfg.episodes), cfg.get("text") or {}
    with ctx.track(cfg, {**common.plugin_tags(cfg), "rlinf.checkpoint": source,
                         "rlinf.modality": world.modality}) as tracker, \
            Progress(ctx.log, "eval", n, "episodes", enabled=bool(cfg.progress)) as progress:
        tracker.log_params(flatten(cfg))
        ev = world.evaluator.evaluate(policy, n, int(cfg.seed), bool(cfg.deterministic), label=label,
                                      on_batch=progress.update, pass_k=int(text.get("pass_k", 0)),
                                      batch=int(text.get("batch", 64)), examples=int(text.get("examples", 8)),
                                      video=video, video_dir=ctx.run_dir / "videos",
                                      video_size=int(cfg.get("video_size", 256)))
        progress.close()
        for f in ev.extra.get("videos", []):
            tracker.log_artifact(Path(f), "videos")
        tracker.log_metrics(ev.metrics, 0)
        result = {"stage": "eval", "modality": world.modality, "checkpoint": source, "run_dir": str(ctx.run_dir),
                  "seconds": round(time.time() - ctx.started, 2), "eval": ev.summary, **ev.extra,
                  "mlflow_run_id": tracker.run_id}
        title = f"rlinf eval: {world.label} (seeds {cfg.seed}..{int(cfg.seed) + n - 1})"
        told = ev.extra.get("instructions")  # language-conditioned simulators: what each row's episodes were told
        table = world.evaluator.table(ev.rows, title, instructions=told)
        if (cfg.get("register") or {}).get("name"):  # opt-in: the MLflow model registry
            result["registry"] = model_registry.register(tracker, source, ev.extra.get("task_mean") or ev.summary, cfg,
                                                         common.table_text(table))
        common.write_result(ctx, tracker, result, table, ev=ev)
        if cfg.output:
            Path(cfg.output).parent.mkdir(parents=True, exist_ok=True)
            Path(cfg.output).write_text(json.dumps(result, indent=2))
        for f in ev.extra.get("videos", []):
            ctx.note(f"video: {f}")
        if "registry" in result:
            r = result["registry"]
            ctx.note(f"MLflow model registry: {r['name']} version {r['version']}" if r["registered"]
                     else f"not registered as {r['name']}: {r['reason']}")
        ctx.console.print_json(json.dumps({"checkpoint": source, **ev.summary,
                                           **({"per_task": ev.extra["per_task"]} if "per_task" in ev.extra else {})}))
    return result
