"""`rlinf collect`: run a policy (scripted expert, checkpoint or random) and append what it does
to a dataset: an rlinf dataset of episodes for a simulator, a JSONL of prompt/completion pairs
for a text task. Appending continues with fresh seeds; one writer per dataset at a time."""

from __future__ import annotations

import time
from typing import Any

from rlinf_cli.config import flatten
from rlinf_cli.errors import UserError
from rlinf_cli.progress import Progress
from rlinf_cli.stages import common


def run(cfg: Any) -> dict[str, Any]:
    try:
        return _run(cfg)
    except KeyboardInterrupt as exc:  # stopped before the dataset was opened
        common.stopped(exc, "nothing was added to the dataset")
        raise


def _run(cfg: Any) -> dict[str, Any]:
    from omegaconf import OmegaConf

    from rlinf_cli import __version__, collectors

    ctx = common.start(cfg, "collect", f"{cfg.sim.name}-{str(cfg.policy).rstrip('/').split('/')[-1]}")
    world = collectors.make(cfg, ctx)
    provenance = {
        "sim": OmegaConf.to_container(cfg.sim, resolve=True), "sim_choice": cfg.choices.get("sim"),
        "policy": str(cfg.policy), "seed": int(cfg.seed), "action_noise": float(cfg.action_noise),
        "epsilon": float(cfg.epsilon), "rlinf_version": __version__, "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    writer = world.recorder.writer(str(cfg.output), provenance, int(cfg.chunk_episodes))
    want = int(cfg.episodes)
    try:  # whatever fails from here on, the dataset keeps what it had and is released
        with ctx.track(cfg, common.plugin_tags(cfg)) as tracker, \
                Progress(ctx.log, f"collect {cfg.policy}", want, "episodes", enabled=bool(cfg.progress)) as progress:
            tracker.log_params(flatten(cfg))
            try:
                kept = world.recorder.record(writer, str(cfg.policy), want, bool(cfg.only_success), progress)
            finally:
                progress.close()
                writer.close()  # finished episodes are never lost
            summary = world.recorder.demos_summary(kept)
            tracker.log_metrics({f"collect/{k}": v for k, v in summary.items()}, 0)
            tracker.log_artifact(writer.meta_path, "dataset")
            result = {"stage": "collect", "modality": world.modality, "dataset": str(writer.path),
                      "episodes_added": len(kept), "episodes_total": writer.episodes_written, "run_dir": str(ctx.run_dir),
                      "seconds": round(time.time() - ctx.started, 2), "summary": summary, "mlflow_run_id": tracker.run_id}
            table = world.evaluator.table({f"{cfg.policy}": summary}, f"rlinf collect -> {writer.path}")
            common.write_result(ctx, tracker, result, table)
            ctx.note(f"dataset: {writer.path} ({writer.episodes_written} episodes in total)")
    except KeyboardInterrupt as exc:  # SIGINT or SIGTERM
        writer.close()
        common.stopped(exc, f"{writer.added} episodes were added to {writer.path} ({writer.episodes_written} in "
                            f"total); run the same command again to add more (it continues with fresh seeds)")
        raise
    finally:
        writer.close()
        world.close()
    if not kept:
        raise UserError("no episode was kept; nothing was added to the dataset")
    return result
