"""`rlinf rl` on a text task: GRPO-family RL of a language model with a verifiable reward.

Each iteration samples ``algo.groups`` prompts x ``algo.group_size`` completions, scores them,
optionally drops zero-variance groups and refills them (``algo.filter_groups``), and runs the
algorithm's token-level update on a :class:`~rlinf_cli.runtime.distributed.Engine`
(``train.backend=torch|deepspeed``). Under torchrun every process samples its own prompts and
rank 0 alone writes the run directory, checkpoints and tracking.
"""

from __future__ import annotations

import copy
import tempfile
import time
from pathlib import Path
from typing import Any

from rlinf_cli.errors import UserError
from rlinf_cli.stages import common, text_common as tc


def run(cfg: Any) -> dict[str, Any]:
    import torch
    from omegaconf import OmegaConf

    from rlinf_cli import checkpoint as ckpt
    from rlinf_cli.config import flatten, to_yaml
    from rlinf_cli.registry import get_registry
    from rlinf_cli.runtime import distributed, text

    algo = get_registry().load("algorithm", cfg.algo.name).from_config(cfg.algo)
    if algo.rollout != "episodes" or not hasattr(algo, "outcome_advantages"):
        raise UserError(f"algorithm '{cfg.algo.name}' does not train on text tasks; use --algo grpo, rloo or reinforce++")
    rank, world = distributed.init_process_group(common.select_accelerator(cfg.accelerator.name))
    OmegaConf.set_struct(cfg, False)
    if rank > 0:  # one writer: other ranks train but keep their files out of the run directory
        cfg.tracking.enabled, cfg.quiet, cfg.progress = False, True, False
        cfg.run_dir = tempfile.mkdtemp(prefix=f"rlinf-rank{rank}-")
    resume_dir = Path(cfg.resume) if cfg.resume else None
    run_dir = common.resumed_run_dir(cfg, resume_dir)
    ctx = common.start(cfg, "rl", f"{cfg.sim.name}-{cfg.algo.name}", run_dir if rank == 0 else None)
    task = tc.make_task(cfg.sim)
    policy = tc.build_policy(cfg, cfg.resume or cfg.init, ctx.device)
    c = algo.config
    engine = distributed.make_engine(policy, c, cfg.train, ctx.accelerator)
    ref_policy = None
    if getattr(c, "kl_coef", 0.0) > 0:  # a frozen copy; skipped entirely when the KL weight is 0
        ref_policy = copy.deepcopy(policy).eval().requires_grad_(False)
    generator = torch.Generator().manual_seed(int(cfg.seed) + rank)
    sampler = torch.Generator(device=policy.device).manual_seed(int(cfg.seed) * 1_000_003 + rank)
    state: dict[str, Any] = {"iteration": 0, "env_steps": 0}
    if resume_dir is not None:
        optimizer = engine.checkpoint_optimizer()
        if optimizer is None:
            raise UserError("resume with train.backend=deepspeed is not supported yet; resume with train.backend=torch")
        state = ckpt.load_training_state(resume_dir, optimizer, generator)
        ctx.note(f"resuming from {resume_dir} at iteration {state['iteration']}")
    iterations = int(cfg.text.iterations)
    new_tokens = tc.max_new_tokens(cfg.text, task)
    cfg_yaml = to_yaml(cfg)
    interval = max(1, int(cfg.checkpoint.interval))
    eval_every = int(cfg.eval.interval)

    def seeds_for(it: int, round_: int = 0) -> list[int]:
        return common.training_seeds(int(cfg.seed), (it * world + rank) * 64 + round_, c.groups)

    def evaluate() -> tuple[dict[str, float], list[Any]]:
        return tc.evaluate(policy, task, int(cfg.eval.episodes), int(cfg.eval.seed), new_tokens)

    from rlinf_cli.progress import Progress

    tags = {**common.plugin_tags(cfg), "rlinf.modality": "text", "rlinf.backend": engine.backend}
    resumed = {"resume_run_id": state.get("mlflow_run_id"), "resume_step": state["iteration"]} if resume_dir else {}
    with ctx.track(cfg, tags, **resumed) as tracker, \
            Progress(ctx.log, f"rl {cfg.algo.name}", iterations, "iterations", enabled=bool(cfg.progress)) as progress:
        ckpt_dir = ctx.run_dir / "checkpoints"
        tracker.log_params(flatten(cfg))
        progress.done = float(state["iteration"])
        if eval_every and state["iteration"] == 0 and rank == 0:
            before, _ = evaluate()
            tracker.log_metrics({f"eval/{k}": v for k, v in before.items()} | {"iteration": 0.0}, 0)
        while state["iteration"] < iterations:
            it = state["iteration"]
            if c.anneal_lr:
                engine.set_lr(c.lr * max(1.0 - it / iterations, 0.0))
            kept, seen, rstats = text.collect_groups(policy, task, algo, seeds_for(it), lambda r: seeds_for(it, r),
                                                     new_tokens, sampler)
            t1 = time.perf_counter()
            metrics: dict[str, float] = {}
            if kept:
                metrics.update(text.update(engine, algo, text.to_batch(policy, kept, c.group_size), generator, ref_policy))
            t_update = time.perf_counter() - t1
            state["iteration"] = it + 1
            state["env_steps"] += len(seen)
            rewards = [x.score.reward for x in seen]
            metrics.update({
                "iteration": float(it + 1),
                "rollout/reward_mean": sum(rewards) / len(rewards),
                "rollout/accuracy": text.accuracy(seen),
                "rollout/completion_tokens_mean": rstats.generated_tokens / len(seen),
                "rollout/groups_dropped": float(rstats.groups_dropped),
                "rollout/groups_kept": float(len(kept) // c.group_size),
                "time/rollout_s": rstats.seconds, "time/update_s": t_update,
                "time/step_s": rstats.seconds + t_update,
                "time/generated_tokens_per_s": rstats.generated_tokens / max(rstats.seconds + t_update, 1e-9),
                "lr": engine.lr,
            })
            if eval_every and state["iteration"] % eval_every == 0 and rank == 0:
                ev, _ = evaluate()
                metrics.update({f"eval/{k}": v for k, v in ev.items()})
            tracker.log_metrics(metrics, state["iteration"])
            progress.update(1, f"reward {metrics['rollout/reward_mean']:.3f}  acc {metrics['rollout/accuracy']:.0%}")
            if state["iteration"] % interval == 0 and rank == 0 and engine.checkpoint_optimizer() is not None:
                state["mlflow_run_id"] = tracker.run_id
                ckpt.save(ckpt_dir / f"iter_{state['iteration']:06d}", policy, cfg_yaml, engine.checkpoint_optimizer(),
                          state, generator)
                ckpt.prune(ckpt_dir, int(cfg.checkpoint.keep))
        progress.close()
        with engine.full_parameters():
            final_dir = ckpt.save(ckpt_dir / "final", policy, cfg_yaml, engine.checkpoint_optimizer(), state, generator) \
                if rank == 0 else ckpt_dir / "final"
        summary, examples = evaluate() if rank == 0 else ({}, [])
        tracker.log_metrics({f"eval/{k}": v for k, v in summary.items()}, state["iteration"])
        result = {"stage": "rl", "modality": "text", "run_dir": str(ctx.run_dir), "checkpoint": str(final_dir),
                  "iterations": state["iteration"], "completions": state["env_steps"], "backend": engine.backend,
                  "world_size": world, "seconds": round(time.time() - ctx.started, 2), "eval": summary,
                  "examples": tc.examples_json(examples, int(cfg.text.examples)), "mlflow_run_id": tracker.run_id}
        if rank == 0:
            table = tc.summary_table({f"{cfg.algo.name} ({state['iteration']} iterations)": summary},
                                     f"rlinf rl: {cfg.sim.name} (held-out seeds {cfg.eval.seed}..)")
            common.write_result(ctx, tracker, result, table, ("iteration", ["rollout/reward_mean", "eval/accuracy"],
                                                              f"rlinf rl {cfg.algo.name} on {cfg.sim.name}"))
            if summary:
                ctx.console.print(table)
                ctx.console.print(tc.examples_table(examples, int(cfg.text.examples)))
            ctx.note(f"run: {ctx.run_dir}  checkpoint: {final_dir}")
    distributed.shutdown()
    return result
