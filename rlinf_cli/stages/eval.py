"""`rlinf eval`: return / success rate of a checkpoint (or random / expert) on fixed seeds."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from rlinf_cli.stages import common


def run(cfg: Any) -> dict[str, Any]:
    from rlinf_cli.stages import text_common

    if text_common.sim_modality(cfg.sim) == "text":
        from rlinf_cli.stages import text_eval

        return text_eval.run_eval(cfg)
    from rlinf_cli.config import flatten

    source = str(cfg.checkpoint)
    sim = common.make_simulator(cfg.sim)
    label = Path(source).name if source not in ("random", "expert") else source
    ctx = common.start(cfg, "eval", f"{cfg.sim.name}-{label}")
    act = common.make_actor(source, sim, ctx.device, bool(cfg.deterministic), int(cfg.seed))
    executor = common.make_executor(cfg.executor, common.runtime_options(cfg, act, sim.spec, int(cfg.num_envs)))
    from rlinf_cli.progress import Progress

    with ctx.track(cfg, {**common.plugin_tags(cfg), "rlinf.checkpoint": source}) as tracker, \
            Progress(ctx.log, "eval", int(cfg.episodes), "episodes", enabled=bool(cfg.progress)) as progress:
        tracker.log_params(flatten(cfg))
        episodes = common.evaluate(act, sim, executor, int(cfg.episodes), int(cfg.seed), int(cfg.num_envs),
                                   on_batch=lambda b: progress.update(len(b)))
        progress.close()
        summary = common.summarize(episodes, sim.spec.has_success)
        metrics = {f"eval/{k}": v for k, v in summary.items()}
        rows = {label: summary}
        extra: dict[str, Any] = {}
        if len(sim.spec.tasks) > 1:  # multi-task: one row per task, then the mean over tasks
            per_task = common.summarize_by_task(episodes, sim.spec.tasks, sim.spec.has_success)
            mean = common.task_mean(per_task)
            extra = {"per_task": per_task, "task_mean": mean}
            rows = {f"{label} · {task}": s for task, s in per_task.items()}
            rows[f"{label} · mean over {len(per_task)} tasks"] = mean
            metrics.update({f"eval/task/{task}/{k}": v for task, s in per_task.items() for k, v in s.items()})
            metrics.update({f"eval/task_mean/{k}": v for k, v in mean.items()})
            if int(cfg.episodes) % len(sim.spec.tasks):
                ctx.note(f"note: {cfg.episodes} episodes over {len(sim.spec.tasks)} tasks: tasks got unequal episode counts")
        tracker.log_metrics(metrics, 0)
        result = {"stage": "eval", "checkpoint": source, "run_dir": str(ctx.run_dir), "seconds": round(time.time() - ctx.started, 2),
                  "eval": summary, **extra, "per_episode": [e.__dict__ for e in episodes], "mlflow_run_id": tracker.run_id}
        table = common.eval_table(rows, f"rlinf eval: {cfg.sim.name} (seeds {cfg.seed}..{int(cfg.seed) + int(cfg.episodes) - 1})")
        common.write_result(ctx, tracker, result, table)
        if cfg.output:
            Path(cfg.output).parent.mkdir(parents=True, exist_ok=True)
            Path(cfg.output).write_text(json.dumps(result, indent=2))
        ctx.console.print(table)
        ctx.console.print_json(json.dumps({"checkpoint": source, **summary, **({"per_task": extra["per_task"]} if extra else {})}))
    return result
