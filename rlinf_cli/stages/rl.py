"""`rlinf rl`: RL training against a simulator, with checkpoints, resume and tracking."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np

from rlinf_cli.errors import UserError
from rlinf_cli.settings import plain
from rlinf_cli.stages import common


def _build_policy(cfg: Any, spec: Any, device: Any) -> Any:
    from rlinf_cli.policy import check_compatible, load_policy
    from rlinf_cli.registry import get_registry

    source = cfg.resume or cfg.init
    if source:
        policy = load_policy(source, device)
        check_compatible(policy, spec, f"checkpoint '{source}'")
    else:
        policy = get_registry().load("model", cfg.model.name)(cfg.model, spec).to(device)
    # RL from a cloned policy (init=): cloning shrank its std until it barely explores, so it is
    # reset; and a fixed std keeps PPO from collapsing or inflating it while the mean improves.
    # A resumed run keeps the std it had.
    std = cfg.get("init_action_std") if cfg.init and not cfg.resume else None
    if std is not None and std <= 0:
        raise UserError(f"init_action_std must be > 0 (or null to keep the checkpoint's), got {std}")
    learn = cfg.get("learn_action_std")
    learn = not cfg.init if learn is None else bool(learn)
    if std is not None or not learn:
        policy.set_action_std(None if std is None else float(std), trainable=learn)
    return policy


def run(cfg: Any) -> dict[str, Any]:
    from rlinf_cli.stages import text_common

    if text_common.sim_modality(cfg.sim) == "text":  # language models on text tasks
        from rlinf_cli.stages import text_rl

        return text_rl.run(cfg)
    import torch

    from rlinf_cli import checkpoint as ckpt
    from rlinf_cli.config import flatten, to_yaml
    from rlinf_cli.registry import get_registry
    from rlinf_cli.runtime.rollout import EpisodeRecorder, EpisodeStats, Runner, policy_actor, run_episodes
    from rlinf_cli.runtime.vector import SyncVecEnv
    from rlinf_cli.runtime.trainer import update
    from rlinf_cli.stages import rl_backend

    algo = get_registry().load("algorithm", cfg.algo.name).from_config(cfg.algo)
    if algo.rollout == "supervised":
        raise UserError(f"algorithm '{cfg.algo.name}' learns from a dataset: use `rlinf sft`, not `rlinf rl`")
    resume_dir = Path(cfg.resume) if cfg.resume else None
    run_dir = common.resumed_run_dir(cfg, resume_dir)  # a resumed run continues in its own directory
    rank, world = rl_backend.setup_ranks(cfg)  # (0, 1) unless torchrun or train.backend=deepspeed
    ctx = common.start(cfg, "rl", f"{cfg.sim.name}-{cfg.algo.name}", run_dir if rank == 0 else None)
    sim = common.make_simulator(cfg.sim)
    policy = _build_policy(cfg, sim.spec, ctx.device)
    if algo.uses_critic and not policy.has_critic:
        raise UserError(f"algorithm '{cfg.algo.name}' needs a critic but the model has none (set model.critic=true)")
    c = algo.config
    episodic = algo.rollout == "episodes"
    num_envs = c.groups * c.group_size if episodic else int(cfg.num_envs)
    executor = common.make_executor(cfg.executor, common.runtime_options(
        cfg, policy_actor(policy, sim.spec, ctx.device, False), sim.spec, num_envs))
    trainer = rl_backend.Trainer(policy, c, cfg, ctx.accelerator, world)
    optimizer = trainer.checkpoint_optimizer()
    generator = torch.Generator().manual_seed(int(cfg.seed) + rank)
    state: dict[str, Any] = {"iteration": 0, "env_steps": 0, "best_return": None}
    if resume_dir is not None:
        if optimizer is None:
            raise UserError(f"resume is not supported with train.backend={trainer.backend} yet; start a new run with init=...")
        state = ckpt.load_training_state(resume_dir, optimizer, generator)
        ctx.note(f"resuming from {resume_dir} at iteration {state['iteration']} ({state['env_steps']:,} env steps)")
    cfg_yaml = to_yaml(cfg)
    interval = max(1, int(cfg.checkpoint.interval))
    total = int(cfg.total_steps)

    overlap = bool(cfg.get("runtime", {}).get("overlap_update", False)) and not episodic
    start_it = state["iteration"]
    # A fresh run starts env seed streams from the seed; a resumed one replays the saved env state
    # (exact), or, where the simulator cannot replay, starts fresh episodes (docs/runtime.md).
    first_seeds = common.training_seeds(int(cfg.seed), start_it * world + rank, num_envs)
    env_state = ckpt.load_rank_state(resume_dir, rank) if resume_dir is not None else None
    if env_state is not None and rank > 0:  # its own RNG streams (rank 0's are in rng.safetensors)
        ckpt.set_rng_state({k[4:]: torch.from_numpy(v) for k, v in env_state.items() if k.startswith("rng.")},
                           generator)
    if overlap:  # the next rollout is collected in another process during the update
        from rlinf_cli.runtime.overlap import OverlappedRunner

        runtime = common.runtime_options(cfg)
        env = runner = OverlappedRunner(
            sim, policy, num_envs, int(cfg.seed) + 1, lambda i: first_seeds if i == start_it else None,
            start_iteration=start_it, start_method=str(runtime.get("start_method", "forkserver")),
            executor=None if runtime.get("mode", "collocated") == "collocated"
            else {**dict(plain(cfg.executor)), "runtime": runtime})
        ctx.note("runtime: rollouts overlap the update in a separate process (one policy version behind)")
    else:
        env = executor.make_vec_env(sim, num_envs, autoreset=not episodic)
        runner = Runner(env, policy, ctx.device)
    tags = {**common.plugin_tags(cfg), **({"rlinf.resumed_from": str(resume_dir)} if resume_dir else {})}
    choice = getattr(executor, "choice", None)
    if choice is not None:  # runtime.mode=auto: say what the probe chose and why
        ctx.note(choice.reason)
    if not overlap and not isinstance(env, SyncVecEnv):  # envs outside this process: say where
        ctx.note(f"runtime: {executor.describe()}")
    tags["rlinf.runtime"] = executor.describe()
    result: dict[str, Any] = {}
    resumed = {"resume_run_id": state.get("mlflow_run_id"), "resume_step": state["env_steps"]} if resume_dir else {}
    with ctx.track(cfg, tags, **resumed) as tracker, \
            _progress(ctx, cfg, total, state["env_steps"]) as progress:
        ckpt_dir = ctx.run_dir / "checkpoints"
        tracker.log_params(flatten(cfg))
        recent: list[Any] = [EpisodeStats(*e) for e in state.pop("recent_episodes", [])]
        try:
            if not overlap and not episodic:
                if env_state is not None and "streams" in env_state and sim.spec.replayable:
                    runner.restore(env_state)
                else:
                    if resume_dir is not None:
                        ctx.note("resume: the simulator's episodes cannot be replayed (EnvSpec.replayable=False or no "
                                 "saved env state); the resumed run starts fresh episodes")
                    runner.reset(first_seeds)
            while state["env_steps"] < total:
                it = state["iteration"]
                if c.anneal_lr:
                    trainer.set_lr(c.lr * max(1.0 - state["env_steps"] / total, 0.0))
                t0, cpu0 = time.perf_counter(), time.process_time()
                if episodic:
                    seeds = common.training_seeds(int(cfg.seed), it * world + rank, c.groups)
                    recorder = EpisodeRecorder()
                    episodes = run_episodes(env, policy_actor(policy, sim.spec, ctx.device, False),
                                            [s for s in seeds for _ in range(c.group_size)], recorder)
                    rollout = recorder.to_rollout(episodes, ctx.device)
                    keep = algo.filter_groups(rollout.episode_returns)
                    if keep is not None:
                        rollout.mask = rollout.mask * keep.repeat_interleave(c.group_size).to(rollout.mask).unsqueeze(0)
                else:
                    rollout = runner.collect_steps(c.rollout_steps)
                t_rollout = time.perf_counter() - t0
                # Only a cloned actor (init=) needs protecting from an untrained critic's advantages.
                warmup = bool(cfg.init) and it < getattr(c, "critic_warmup_iters", 0)
                metrics = update(policy, trainer.handle, algo, rollout, generator, train_actor=not warmup)
                t_update = time.perf_counter() - t0 - t_rollout
                cpu = time.process_time() - cpu0  # this process only: shows contention next to wall time
                state["iteration"] = it + 1
                state["env_steps"] += rollout.env_steps * world  # every rank collected its own
                recent = (recent + rollout.episodes)[-100:]
                metrics.update(_rollout_metrics(rollout, recent, sim.spec.has_success))
                metrics.update({"time/rollout_s": t_rollout, "time/update_s": t_update, "time/cpu_s": cpu,
                                "time/env_steps_per_s": rollout.env_steps / max(t_rollout + t_update, 1e-9),
                                "env_steps": float(state["env_steps"]), "lr": trainer.lr})
                if cfg.eval.interval and state["iteration"] % int(cfg.eval.interval) == 0 and rank == 0:
                    ev = _evaluate(policy, sim, executor, cfg, ctx)
                    metrics.update({f"eval/{k}": v for k, v in ev.items()})
                tracker.log_metrics(metrics, state["env_steps"])
                progress.update(rollout.env_steps * world, _info(metrics, state["iteration"]))
                if state["iteration"] % interval == 0 and optimizer is not None:
                    _checkpoint(ckpt_dir / f"iter_{state['iteration']:06d}", policy, cfg_yaml, optimizer, state,
                                generator, runner if not (overlap or episodic) else None, recent, tracker, rank)
                    if rank == 0:
                        ckpt.prune(ckpt_dir, int(cfg.checkpoint.keep))
        except KeyboardInterrupt:
            progress.close()
            last = ckpt.latest(ckpt_dir)
            ctx.note(f"interrupted; resume with: rlinf rl resume={last}" if last else "interrupted before the first checkpoint")
            raise
        finally:
            env.close()
        progress.close()
        with trainer.full_parameters():
            final_dir = _checkpoint(ckpt_dir / "final", policy, cfg_yaml, optimizer, state, generator,
                                    runner if not (overlap or episodic) else None, recent, tracker, rank)
            summary = _evaluate(policy, sim, executor, cfg, ctx) if rank == 0 else {}
        trainer.close()
        tracker.log_metrics({f"eval/{k}": v for k, v in summary.items()}, state["env_steps"])
        result = {"stage": "rl", "run_dir": str(ctx.run_dir), "checkpoint": str(final_dir),
                  "env_steps": state["env_steps"], "iterations": state["iteration"],
                  "seconds": round(time.time() - ctx.started, 2), "eval": summary, "mlflow_run_id": tracker.run_id}
        table = common.eval_table({f"{cfg.algo.name} ({state['env_steps']:,} steps)": summary},
                                  f"rlinf rl: {_sim_label(cfg)}") if summary else None  # eval.episodes=0: no table
        common.write_result(ctx, tracker, result, table,
                            ("env_steps", ["rollout/return_mean", "rollout/success_once", "eval/return_mean"],
                             f"rlinf rl {cfg.algo.name} on {_sim_label(cfg)}"))
        if rank == 0:
            if table is not None:
                ctx.console.print(table)
            ctx.note(f"run: {ctx.run_dir}  checkpoint: {final_dir}")
    return result


def _checkpoint(path: Path, policy: Any, cfg_yaml: str, optimizer: Any, state: dict[str, Any], generator: Any,
                runner: Any, recent: list[Any], tracker: Any, rank: int) -> Path:
    """Save a resumable checkpoint (rank 0 writes it; every rank hands in its env and RNG state)."""
    from dataclasses import astuple

    from rlinf_cli import checkpoint as ckpt
    from rlinf_cli.runtime.distributed import gather_to_first

    mine: dict[str, Any] = dict(runner.state()) if runner is not None else {}
    if rank > 0:
        mine.update({f"rng.{k}": v for k, v in ckpt.rng_state(generator).items()})
    states = gather_to_first(mine)
    if rank != 0:
        return path
    tracker.flush()  # MLflow holds every point up to the checkpoint (resume re-syncs the rest)
    saved = {**state, "mlflow_run_id": tracker.run_id, "recent_episodes": [list(astuple(e))[:4] for e in recent]}
    return ckpt.save(path, policy, cfg_yaml, optimizer, saved, generator, states if any(states) else None)


def _sim_label(cfg: Any) -> str:
    sim = cfg.sim
    for key in ("env_id", "task", "tasks"):
        if sim.get(key):
            return f"{sim.name}/{sim.get(key)}"
    return str(sim.name)


def _progress(ctx: Any, cfg: Any, total: int, done: int) -> Any:
    from rlinf_cli.progress import Progress

    p = Progress(ctx.log, f"rl {cfg.algo.name}", total, "steps", enabled=bool(cfg.progress))
    p.done = float(done)
    return p


def _info(m: dict[str, float], iteration: int) -> str:
    parts = [f"iter {iteration}"]
    if "rollout/return_mean" in m:
        parts.append(f"return {m['rollout/return_mean']:.1f}")
    if "rollout/success_once" in m:
        parts.append(f"success {m['rollout/success_once']:.0%}")
    return "  ".join(parts)


def _rollout_metrics(rollout: Any, recent: list[Any], has_success: bool) -> dict[str, float]:
    out = {f"rollout/{k}": v for k, v in rollout.stats.items()}
    if rollout.episodes:
        s = common.summarize(rollout.episodes, has_success)
        out.update({f"rollout/{k}": v for k, v in s.items() if k != "return_std"})
    if recent:
        out["rollout/return_mean_100"] = float(np.mean([e.ret for e in recent]))
    return out


def _evaluate(policy: Any, sim: Any, executor: Any, cfg: Any, ctx: Any) -> dict[str, float]:
    from rlinf_cli.runtime.rollout import policy_actor

    episodes = common.evaluate(policy_actor(policy, sim.spec, ctx.device, bool(cfg.eval.deterministic)), sim, executor,
                               int(cfg.eval.episodes), int(cfg.eval.seed), int(cfg.num_envs))
    return common.summarize(episodes, sim.spec.has_success)
