"""`rlinf sft`: supervised fine-tuning / behaviour cloning, the same loop for every dataset.

An rlinf dataset (observation, action steps) clones a policy; a JSONL file of prompt/completion
pairs fine-tunes a language model. Either way: epochs of shuffled minibatches scored by the
algorithm's ``supervised_loss``, the best checkpoint kept on held-out data, and, when the dataset
says which simulator or task made it, an evaluation there (the checkpoint remembers it, so
`rl init=` and `eval` reuse it).
"""

from __future__ import annotations

import math
import time
from typing import Any

from rlinf_cli.config import flatten, to_yaml
from rlinf_cli.errors import UserError
from rlinf_cli.progress import Progress
from rlinf_cli.stages import common


def setup(cfg: Any) -> tuple[Any, Any, Any, Any, Any, Any, int]:
    from omegaconf import OmegaConf

    from rlinf_cli import collectors
    from rlinf_cli.runtime.dist import setup_ranks
    from rlinf_cli.runtime.engine import make_engine
    from rlinf_cli.runtime.precision import precision_note

    text, sim_node, sim_choice = collectors.dataset_source(cfg.dataset)  # a missing dataset is the first error
    algo = common.load_algorithm(cfg, "sft")
    OmegaConf.set_struct(cfg, False)
    if sim_node:  # the checkpoint remembers the dataset's simulator, so `rl init=` and `eval` can use it
        cfg.sim = sim_node
        cfg.choices.sim = sim_choice
    accel = common.select_accelerator(cfg.accelerator.name)
    rank, _ = setup_ranks(cfg, accel)
    ctx = common.start(cfg, "sft", f"{(sim_node or {}).get('name', 'dataset')}-{cfg.model.name}", accel=accel)
    world = collectors.make(cfg, ctx, sim_node, text=text)
    data = world.recorder.dataset(str(cfg.dataset), float(cfg.val_fraction), int(cfg.seed))
    algo.check(data.spec)
    policy = world.policies.policy(cfg.init, cfg.model, data.spec, check=False)  # the dataset checks it
    if world.policies.normalizer is not None:
        raise UserError(f"init={cfg.init} was trained on normalized observations (env.normalize_obs); `rlinf sft` "
                        f"trains on the dataset's raw observations: start from a checkpoint without statistics")
    data.prepare(policy, ctx.note)
    engine = make_engine(policy, algo.optim, cfg.train, ctx.accelerator)
    note = precision_note(engine)
    if note:
        ctx.note(note)
    return ctx, algo, world, data, policy, engine, rank


def train(cfg: Any, ctx: Any, algo: Any, data: Any, policy: Any, engine: Any, tracker: Any, progress: Any,
          rank: int) -> tuple[float, int]:
    """Epochs until ``algo.epochs`` or ``patience``; returns (best validation loss, its epoch)."""
    cfg_yaml, ckpt_dir = to_yaml(cfg), ctx.run_dir / "checkpoints"
    total_steps = data.steps_per_epoch(algo.minibatch_size) * algo.epochs
    patience = getattr(algo.config, "patience", None)
    best, bad_epochs, step, t0 = (math.inf, -1), 0, 0, time.perf_counter()
    for epoch in range(algo.epochs):
        policy.train()
        total, count = 0.0, 0
        for mb in data.minibatches(algo.minibatch_size):
            engine.schedule(step / total_steps)
            with engine.autocast():  # train.bf16: the forward pass and loss in mixed precision
                loss = algo.supervised_loss(policy, mb)
            engine.backward(loss)
            engine.step()
            total, count, step = total + float(loss.detach()), count + 1, step + 1
            progress.update(1, f"loss {total / count:.4f}")
        policy.eval()
        metrics = {"train/loss": total / max(count, 1), "epoch": float(epoch + 1),
                   **data.metrics(time.perf_counter() - t0)}
        val = data.val_loss(policy, algo)
        if val is not None:
            metrics["val/loss"] = val
        score = metrics.get("val/loss", metrics["train/loss"])
        if score < best[0]:
            best, bad_epochs = (score, epoch + 1), 0
            with engine.full_parameters():
                common.save_checkpoint(ckpt_dir / "best", policy, cfg_yaml, rank=rank)
        else:
            bad_epochs += 1
        tracker.log_metrics(metrics, epoch + 1)
        if patience is not None and bad_epochs >= patience:
            ctx.note(f"early stop: no better validation loss for {patience} epochs")
            break
    progress.close()
    with engine.full_parameters():
        common.save_checkpoint(ckpt_dir / "last", policy, cfg_yaml, rank=rank)
    return best


def stop_note(ctx: Any) -> str:
    """What a stopped `sft` kept (it does not resume: a new run can start from its best checkpoint)."""
    best = ctx.run_dir / "checkpoints" / "best" if ctx is not None else None
    if best is None or not (best / "config.json").is_file():
        return "no checkpoint was saved yet (the first comes after the first epoch); run the command again"
    return (f"the best checkpoint so far is {best}; `rlinf sft` does not resume: run the command again, "
            f"or continue training from that checkpoint with init={best}")


def run(cfg: Any) -> dict[str, Any]:
    ctx = None
    try:
        ctx, *parts = setup(cfg)
        return _run(cfg, ctx, *parts)
    except KeyboardInterrupt as exc:  # SIGINT or SIGTERM
        common.stopped(exc, stop_note(ctx))
        raise


def _run(cfg: Any, ctx: Any, algo: Any, world: Any, data: Any, policy: Any, engine: Any, rank: int) -> dict[str, Any]:
    from rlinf_cli.runtime.dist import shutdown

    total_steps = data.steps_per_epoch(algo.minibatch_size) * algo.epochs
    with ctx.track(cfg, {**common.plugin_tags(cfg), "rlinf.modality": world.modality}) as tracker, \
            Progress(ctx.log, f"sft {cfg.model.name}", total_steps, "steps", enabled=bool(cfg.progress)) as progress:
        tracker.log_params({**flatten(cfg), "train.precision_used": engine.precision})  # measured, not asked
        if data.meta_file is not None:
            tracker.log_artifact(data.meta_file, "dataset")
        best = train(cfg, ctx, algo, data, policy, engine, tracker, progress, rank)
        best_dir = ctx.run_dir / "checkpoints" / "best"
        ev = None
        if int(cfg.eval.episodes) > 0 and cfg.get("sim") and rank == 0:  # in the dataset's simulator or task
            ev = world.evaluator.evaluate(world.policies.policy(str(best_dir)), int(cfg.eval.episodes),
                                         int(cfg.eval.seed), bool(cfg.eval.deterministic),
                                         label=f"sft {cfg.model.name} (best epoch {best[1]})")
            tracker.log_metrics(ev.metrics, best[1])
        engine.close()
        shutdown()
        result = {"stage": "sft", "modality": world.modality, "run_dir": str(ctx.run_dir),
                  "checkpoint": str(best_dir), "best_epoch": best[1], "best_loss": best[0], **data.describe(),
                  "seconds": round(time.time() - ctx.started, 2), "eval": ev.summary if ev else {},
                  "mlflow_run_id": tracker.run_id}
        table = world.evaluator.table(ev.rows, "rlinf sft") if ev is not None and ev.summary else None
        common.write_result(ctx, tracker, result, table, ("epoch", ["train/loss", "val/loss"], "rlinf sft"), ev)
        ctx.note(f"run: {ctx.run_dir}  best checkpoint: {best_dir} (epoch {best[1]}, loss {best[0]:.4f})")
    return result
