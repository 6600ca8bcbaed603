"""`rlinf rl`: RL training, the same loop for every modality.

start -> resume -> per iteration: collect -> update (advantages, epochs of minibatches on the
engine) -> log / evaluate / checkpoint -> final checkpoint and evaluation. What differs between
an embodied simulator and a text task lives in the collector (``rlinf_cli.collectors``); what
differs between algorithms in the algorithm; where training runs in the engine.
"""

from __future__ import annotations

import copy
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rlinf_cli.errors import UserError
from rlinf_cli.stages import common


@dataclass
class Run:
    """Everything one `rl` run holds."""

    cfg: Any
    ctx: Any
    algo: Any
    collector: Any
    policy: Any
    engine: Any
    generator: Any
    rank: int
    world: int
    state: dict[str, Any]
    saved: Any = None
    reference: Any = None
    cfg_yaml: str = ""
    tracker: Any = None

    @property
    def done(self) -> float:
        """Fraction of the budget used (the unit of the learning-rate schedule)."""
        return self.collector.units(self.state) / self.collector.budget(self.cfg)

    def step(self) -> int:
        """The x axis of every metric: env steps (embodied) or iterations (text)."""
        return int(self.collector.units(self.state))


def model_config(cfg: Any, algo: Any) -> Any:
    """``cfg.model`` with what the algorithm needs of a fresh model (``algo.model_options()``)."""
    from omegaconf import OmegaConf, open_dict

    options = algo.model_options()
    if not options or cfg.resume or cfg.init:
        return cfg.model
    lacking = [k for k in options if k not in cfg.model]
    if lacking:
        raise UserError(f"algorithm '{cfg.algo.name}' needs model options {', '.join(lacking)}, which model "
                        f"'{cfg.model.name}' does not have; use a model that implements them (model=mlp)")
    node = OmegaConf.create(OmegaConf.to_container(cfg.model, resolve=True))
    with open_dict(node):
        for k, v in options.items():
            node[k] = v
    return node


def setup(cfg: Any) -> Run:
    import torch

    from rlinf_cli import collectors
    from rlinf_cli.runtime.engine import make_engine, precision_note, setup_ranks

    algo = common.load_algorithm(cfg, "rl")
    if cfg.get("demos"):  # before any work: the dataset must exist, and the algorithm must sample it
        from rlinf_cli.data.dataset import read_meta

        if algo.rollout != "transitions":
            raise UserError(f"demos= seeds the replay buffer of off-policy algorithms (algo=sac); '{cfg.algo.name}' "
                            f"learns from rollout='{algo.rollout}' (for demonstrations, use `rlinf sft` then rl init=)")
        read_meta(Path(str(cfg.demos)))
    resume_dir = Path(cfg.resume) if cfg.resume else None
    accel = common.select_accelerator(cfg.accelerator.name)
    rank, world = setup_ranks(cfg, accel)  # (0, 1) unless torchrun or train.backend=deepspeed
    ctx = common.start(cfg, "rl", f"{cfg.sim.name}-{cfg.algo.name}",
                       common.resumed_run_dir(cfg, resume_dir) if rank == 0 else None, accel)
    collector = collectors.make(cfg, ctx)
    collector.check_video(int(cfg.eval.get("video", 0) or 0), int(cfg.eval.get("video_size", 256)))  # before training
    algo.check(collector.spec)
    policy = collector.policy(cfg.resume or cfg.init, model_config(cfg, algo))
    collector.prepare_rl(policy, cfg)
    if algo.uses_critic and not policy.has_critic:
        raise UserError(f"algorithm '{cfg.algo.name}' needs a critic but the model has none (set model.critic=true)")
    if algo.uses_q and not getattr(policy, "has_q", False):
        raise UserError(f"algorithm '{cfg.algo.name}' needs a model with Q heads (the off-policy interface of "
                        f"rlinf_cli/policy.py); {'the checkpoint' if cfg.resume or cfg.init else 'this model'} has none")
    engine = make_engine(policy, algo.optim, cfg.train, ctx.accelerator)
    note = precision_note(engine)
    if note:
        ctx.note(note)
    # a frozen copy of the starting policy, only when the algorithm asks for one (a KL term)
    reference = None
    if algo.needs_reference():
        # a resumed run keeps its reference: the init= policy it started from, not the resumed weights
        start = policy
        if cfg.resume and cfg.init:
            start = collector.policy(cfg.init, model_config(cfg, algo))
            collector.prepare_rl(start, cfg, fresh=True)
        reference = copy.deepcopy(start).eval().requires_grad_(False)
    generator = torch.Generator().manual_seed(int(cfg.seed) + rank)
    run = Run(cfg, ctx, algo, collector, policy, engine, generator, rank, world,
              {"iteration": 0, "env_steps": 0}, reference=reference)
    if resume_dir is not None:
        run.state, run.saved = common.resume(resume_dir, engine, generator, rank)
        ctx.note(f"resuming from {resume_dir} at iteration {run.state['iteration']}")
    return run


def iterate(run: Run) -> dict[str, float]:
    """One iteration: collect, update, and the metrics of both."""
    from rlinf_cli.runtime.update import update

    it = run.state["iteration"]
    run.engine.schedule(run.done)
    t0, cpu0 = time.perf_counter(), time.process_time()
    exp = run.collector.collect(run.policy, run.algo, it)
    if run.reference is not None:
        exp.ref_logprobs = run.collector.logprobs(run.reference, exp)
    t_rollout = time.perf_counter() - t0
    metrics = update(run.engine, run.algo, exp, run.collector, run.generator,
                     critic_only=run.algo.critic_only(it, bool(run.cfg.init)))
    t_update = time.perf_counter() - t0 - t_rollout
    run.state["iteration"] = it + 1
    run.state["env_steps"] += exp.env_steps * run.world  # every rank collected its own
    metrics.update(run.collector.metrics(exp, t_rollout + t_update))
    metrics.update({"time/rollout_s": t_rollout, "time/update_s": t_update, "time/step_s": t_rollout + t_update,
                    "time/cpu_s": time.process_time() - cpu0,  # this process only: contention shows beside wall time
                    "iteration": float(it + 1), "env_steps": float(run.state["env_steps"]), "lr": run.engine.lr})
    return metrics


def checkpoint(run: Run, name: str) -> Path:
    return common.save_checkpoint(run.ctx.run_dir / "checkpoints" / name, run.policy, run.cfg_yaml, run.engine,
                                  {**run.state, "mlflow_run_id": run.tracker.run_id}, run.generator, run.collector,
                                  run.rank)


def evaluate(run: Run, tag: str = "final") -> Any:
    """Held-out evaluation of the current policy; ``eval.video=N`` records N episodes under videos/<tag>/."""
    cfg = run.cfg
    ev = run.collector.evaluate(run.policy, int(cfg.eval.episodes), int(cfg.eval.seed),
                                bool(cfg.eval.get("deterministic", True)), label=str(cfg.algo.name),
                                examples=int((cfg.get("text") or {}).get("examples", 8)),
                                video=int(cfg.eval.get("video", 0) or 0), video_dir=run.ctx.run_dir / "videos" / tag,
                                video_size=int(cfg.eval.get("video_size", 256)))
    for f in ev.extra.get("videos", []):
        run.tracker.log_artifact(Path(f), f"videos/{tag}")
    return ev


def train(run: Run, progress: Any) -> None:
    """The loop, with periodic evaluation and checkpoints; Ctrl-C says how to resume."""
    from rlinf_cli import checkpoint as ckpt

    cfg, state = run.cfg, run.state
    interval, eval_every = max(1, int(cfg.checkpoint.interval)), int(cfg.eval.interval)
    total = run.collector.budget(cfg)
    try:
        for line in run.collector.start(run.policy, run.algo, run.rank, run.world, state, run.saved):
            run.ctx.note(line)
        if eval_every and state["iteration"] == 0 and run.rank == 0:  # where the curve starts
            run.tracker.log_metrics(evaluate(run, "iter_000000").metrics | {"iteration": 0.0}, 0)
        while run.collector.units(state) < total:
            before = run.step()
            metrics = iterate(run)
            if eval_every and state["iteration"] % eval_every == 0 and run.rank == 0:
                metrics.update(evaluate(run, f"iter_{state['iteration']:06d}").metrics)
            run.tracker.log_metrics(metrics, run.step())
            info = run.collector.info(metrics)
            progress.update(run.step() - before, f"iter {state['iteration']}" + (f"  {info}" if info else ""))
            if state["iteration"] % interval == 0:
                checkpoint(run, f"iter_{state['iteration']:06d}")
                if run.rank == 0:
                    ckpt.prune(run.ctx.run_dir / "checkpoints", int(cfg.checkpoint.keep))
    except KeyboardInterrupt:
        progress.close()
        last = ckpt.latest(run.ctx.run_dir / "checkpoints")
        run.ctx.note(f"interrupted; resume with: rlinf rl resume={last}" if last else "interrupted before the first checkpoint")
        raise
    finally:
        run.collector.close()
    progress.close()


def finish(run: Run) -> dict[str, Any]:
    """Final checkpoint and evaluation, result.json, table and learning curve."""
    from rlinf_cli.runtime.engine import shutdown

    cfg, ctx = run.cfg, run.ctx
    with run.engine.full_parameters():
        final_dir = checkpoint(run, "final")
        ev = evaluate(run) if run.rank == 0 else None
    run.engine.close()
    shutdown()
    summary = ev.summary if ev is not None else {}
    run.tracker.log_metrics({k: v for k, v in (ev.metrics if ev else {}).items()}, run.step())
    result = {"stage": "rl", "modality": run.collector.modality, "run_dir": str(ctx.run_dir),
              "checkpoint": str(final_dir), "env_steps": run.state["env_steps"], "iterations": run.state["iteration"],
              "backend": run.engine.backend, "world_size": run.world, "seconds": round(time.time() - ctx.started, 2),
              "eval": summary, "mlflow_run_id": run.tracker.run_id}
    if (ctx.run_dir / "videos").is_dir():
        result["videos"] = sorted(str(f) for f in (ctx.run_dir / "videos").rglob("*.mp4"))
    x = "env_steps" if run.collector.unit == "steps" else "iteration"
    table = run.collector.table({f"{cfg.algo.name} ({run.step():,} {run.collector.unit})": summary},
                                f"rlinf rl: {run.collector.label}") if summary else None  # eval.episodes=0: no table
    common.write_result(ctx, run.tracker, result, table,
                        (x, ["rollout/return_mean", "rollout/success_once", "rollout/reward_mean", "eval/return_mean",
                             "eval/accuracy"], f"rlinf rl {cfg.algo.name} on {run.collector.label}"),
                        ev, show=run.rank == 0)
    if run.rank == 0:
        ctx.note(f"run: {ctx.run_dir}  checkpoint: {final_dir}")
    return result


def run(cfg: Any) -> dict[str, Any]:
    from rlinf_cli.config import flatten, to_yaml
    from rlinf_cli.progress import Progress

    r = setup(cfg)
    r.cfg_yaml = to_yaml(cfg)
    tags = {**common.plugin_tags(cfg), "rlinf.modality": r.collector.modality, "rlinf.backend": r.engine.backend}
    resumed = {"resume_run_id": r.state.get("mlflow_run_id"), "resume_step": r.step()} if cfg.resume else {}
    with r.ctx.track(cfg, tags, **resumed) as r.tracker, \
            Progress(r.ctx.log, f"rl {cfg.algo.name}", r.collector.budget(cfg), r.collector.unit,
                     enabled=bool(cfg.progress)) as progress:
        progress.done = float(r.step())
        r.tracker.log_params(flatten(cfg))
        train(r, progress)
        return finish(r)
