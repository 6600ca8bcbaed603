"""`rlinf rl`: RL training, the same loop for every modality.

start -> resume -> per iteration: collect -> update (advantages, epochs of minibatches on the
engine) -> log / evaluate / checkpoint -> final checkpoint and evaluation. What differs between
an embodied simulator and a text task lives in the world's roles (``rlinf_cli.collectors``: its
rollout, batches, evaluator); what differs between algorithms in the algorithm; where training
runs in the engine.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rlinf_cli.config import flatten, to_yaml
from rlinf_cli.errors import UserError
from rlinf_cli.progress import Progress
from rlinf_cli.stages import common, keep
from rlinf_cli.validate import check_best, validation_episodes


@dataclass
class Run:
    """Everything one `rl` run holds."""

    cfg: Any
    ctx: Any
    algo: Any
    world: Any  # rlinf_cli.collectors.roles.World
    policy: Any
    engine: Any
    generator: Any
    rank: int
    world_size: int
    state: dict[str, Any]
    saved: Any = None
    reference: Any = None
    demos: Any = None  # demonstrations beside on-policy RL (on_policy_demos), or None
    cfg_yaml: str = ""
    tracker: Any = None

    @property
    def done(self) -> float:
        """Fraction of the budget used (the unit of the learning-rate schedule)."""
        return self.world.rollout.units(self.state) / self.world.rollout.budget()

    def step(self) -> int:
        """The x axis of every metric: env steps (embodied) or iterations (text)."""
        return int(self.world.rollout.units(self.state))


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
    from rlinf_cli.policy import declared_critic
    from rlinf_cli.runtime.dist import setup_ranks
    from rlinf_cli.runtime.engine import make_engine
    from rlinf_cli.runtime.precision import precision_note

    check_best(cfg)
    algo = common.load_algorithm(cfg, "rl")
    if cfg.get("demos"):  # before any work: the dataset must exist, and the algorithm must use it
        from rlinf_cli.data.dataset import read_meta

        if algo.rollout != "transitions" and algo.demo_coef(0.0) <= 0:
            raise UserError(f"demos= seeds the replay buffer of off-policy algorithms (algo=sac) or an on-policy "
                            f"algorithm's imitation term (ppo: algo.bc_coef > 0); '{cfg.algo.name}' has neither here")
        read_meta(Path(str(cfg.demos)))
    resume_dir = Path(cfg.resume) if cfg.resume else None
    accel = common.select_accelerator(cfg.accelerator.name)
    rank, world_size = setup_ranks(cfg, accel)  # (0, 1) unless torchrun or train.backend=deepspeed
    ctx = common.start(cfg, "rl", f"{cfg.sim.name}-{cfg.algo.name}",
                       common.resumed_run_dir(cfg, resume_dir) if rank == 0 else None, accel)
    world = collectors.make(cfg, ctx)
    world.evaluator.check_video(int(cfg.eval.get("video", 0) or 0), int(cfg.eval.get("video_size", 256)))  # before training
    algo.check(world.spec)
    policy = ready_policy(cfg, algo, world, ctx)
    engine = make_engine(policy, algo.optim, cfg.train, ctx.accelerator)
    note = precision_note(engine)
    if note:
        ctx.note(note)
    # the starting policy, frozen, only when the algorithm asks for it (a KL term); the model
    # decides how to keep it (Policy.reference: a copy, or its own weights with an adapter off)
    reference = None
    if algo.needs_reference():
        # a resumed run keeps its reference: the init= policy it started from, not the resumed weights
        start = None if cfg.resume else policy
        if cfg.resume and cfg.init:
            start = world.policies.policy(cfg.init, model_config(cfg, algo))
            world.policies.prepare_rl(start, fresh=True)
        reference = policy.reference(start)
    generator = torch.Generator().manual_seed(int(cfg.seed) + rank)
    run = Run(cfg, ctx, algo, world, policy, engine, generator, rank, world_size,
              {"iteration": 0, "env_steps": 0}, reference=reference, demos=on_policy_demos(cfg, algo, world, policy, ctx))
    if resume_dir is not None:
        run.state, run.saved = common.resume(resume_dir, engine, generator, rank)
        ctx.note(f"resuming from {resume_dir} at iteration {run.state['iteration']}")
        if run.state.get("best") is not None:
            keep.restore_best(run, resume_dir)
    if algo.critic_only(int(run.state["iteration"]), bool(cfg.init)):
        declared_critic(policy, algo.name)  # a warm-up with nothing to train: refused before the first rollout
    return run


def ready_policy(cfg: Any, algo: Any, world: Any, ctx: Any) -> Any:
    """The run's policy, built or loaded (``init=``, ``resume=``) and made ready for ``algo`` before
    the optimizer exists: a clone's exploration std, a fresh critic where the algorithm needs one
    and the model can add it, Q heads checked, and on a first start ``algo.start``."""
    policy = world.policies.policy(cfg.resume or cfg.init, model_config(cfg, algo))
    if cfg.get("init_residual") and not cfg.resume:
        policy = residual_of(policy, cfg, ctx)
    world.policies.prepare_rl(policy)
    if algo.uses_critic and not policy.has_critic:
        if not policy.add_critic():
            raise UserError(f"algorithm '{cfg.algo.name}' needs a critic but the model has none (set model.critic=true)")
        ctx.note(f"the model had no critic: {cfg.algo.name} trains a fresh value head with it")
    if algo.uses_q and not getattr(policy, "has_q", False):
        options = " ".join(f"model.{k}={str(v).lower() if isinstance(v, bool) else v}"
                           for k, v in algo.model_options().items())
        raise UserError(f"algorithm '{cfg.algo.name}' needs a model with Q heads (the off-policy interface of "
                        f"rlinf_cli/policy.py); {'the checkpoint' if cfg.resume or cfg.init else 'this model'} has none"
                        + (f" (clone one for it with `rlinf sft ... {options}`; docs/algorithms.md, \"SAC from a clone\")"
                           if cfg.init and options else ""))
    if not cfg.resume:
        note = algo.start(policy, bool(cfg.init))
        if note:
            ctx.note(note)
    return policy


def residual_of(policy: Any, cfg: Any, ctx: Any) -> Any:
    """``init_residual=true``: the clone frozen as the base of a correction RL learns (Policy.residual)."""
    if not cfg.init:
        raise UserError("init_residual=true learns a correction on top of a clone: set init=<checkpoint> "
                        "(from `rlinf sft`), or init_residual=false")
    residual = policy.residual()
    if residual is None:
        name = policy.config.get("name", type(policy).__name__)
        raise UserError(f"model '{name}' cannot learn a residual on this checkpoint (Policy.residual; model=mlp "
                        f"with Gaussian actions can): set init_residual=false")
    ctx.note("residual RL: the clone is frozen and RL learns a correction added to its actions, starting at zero")
    return residual


def on_policy_demos(cfg: Any, algo: Any, world: Any, policy: Any, ctx: Any) -> Any:
    """The demonstrations an on-policy algorithm's imitation term draws from
    (:meth:`Algorithm.demo_coef` > 0): ``demos=``, else the dataset the ``init=`` clone was trained
    on (its rlinf.yaml names it); None where the algorithm has no such term."""
    if algo.rollout == "transitions" or algo.demo_coef(0.0) <= 0:
        return None
    source = cfg.get("demos") or trained_on(cfg.get("init"))
    if not source:
        raise UserError(f"algorithm '{cfg.algo.name}' imitates demonstrations beside RL (its imitation weight is > 0): "
                        f"set demos=<dataset> (an init= written by `rlinf sft` names its own)")
    if world.modality != "embodied":
        raise UserError(f"demonstrations beside on-policy RL are (observation, action) steps of an embodied "
                        f"simulator; this run is {world.modality}: set the imitation weight to 0")
    data = world.recorder.dataset(str(source), 0.0, int(cfg.seed))
    data.prepare(policy, ctx.note)  # the policy must read what the dataset holds (and acts in its chunks)
    ctx.note(f"demonstrations: {len(data.train_idx):,} steps from {source}, imitated beside every minibatch "
             f"(weight {algo.demo_coef(0.0):g})")
    return data


def trained_on(init: Any) -> str | None:
    """The dataset a checkpoint written by `rlinf sft` was trained on, where it is still there."""
    from omegaconf import OmegaConf

    saved = Path(str(init)) / "rlinf.yaml" if init else None
    if saved is None or not saved.is_file():
        return None
    node = OmegaConf.load(saved)
    dataset = node.get("dataset") if node.get("stage") == "sft" else None
    return str(dataset) if dataset and Path(str(dataset)).exists() else None


def note_recommended(run: Run) -> None:
    """One line naming the settings the simulator recommended for this task (after the run has
    started: a run that fails to start says only why)."""
    from omegaconf import OmegaConf

    rec = run.cfg.get("recommended")
    if rec and run.rank == 0:
        values = " ".join(f"{k}={OmegaConf.select(run.cfg, str(k))}" for k in rec["keys"])
        run.ctx.note(f"recommended for {rec['for']}: {values} (any override wins)")


def iterate(run: Run) -> dict[str, float]:
    """One iteration: collect, update, and the metrics of both."""
    from rlinf_cli.runtime.update import update

    it = run.state["iteration"]
    run.engine.schedule(run.done)
    t0, cpu0 = time.perf_counter(), time.process_time()
    exp = run.world.rollout.collect(run.policy, run.algo, it)
    if run.reference is not None:
        exp.ref_logprobs = run.world.rollout.logprobs(run.reference, exp)
    t_rollout = time.perf_counter() - t0
    metrics = update(run.engine, run.algo, exp, run.world.batches, run.generator,
                     critic_only=run.algo.critic_only(it, bool(run.cfg.init)), demos=run.demos,
                     demo_coef=run.algo.demo_coef(run.done) if run.demos is not None else 0.0)
    t_update = time.perf_counter() - t0 - t_rollout
    run.state["iteration"] = it + 1
    run.state["env_steps"] += exp.env_steps * run.world_size  # every rank collected its own
    metrics.update(run.world.rollout.metrics(exp, t_rollout + t_update))
    metrics.update({"time/rollout_s": t_rollout, "time/update_s": t_update, "time/step_s": t_rollout + t_update,
                    "time/cpu_s": time.process_time() - cpu0,  # this process only: contention shows beside wall time
                    "iteration": float(it + 1), "env_steps": float(run.state["env_steps"]), "lr": run.engine.lr})
    return metrics


def checkpoint(run: Run, name: str) -> Path:
    from rlinf_cli import checkpoint as ckpt

    try:
        path = common.save_checkpoint(run.ctx.run_dir / "checkpoints" / name, run.policy, run.cfg_yaml, run.engine,
                                      {**run.state, "mlflow_run_id": run.tracker.run_id}, run.generator, run.world.rollout,
                                      run.rank)
    except ckpt.CheckpointWriteError as exc:  # the run ends here: say where it can go on from
        last = ckpt.latest(run.ctx.run_dir / "checkpoints")
        then = f"free space, then resume with: rlinf rl resume={last}" if last else \
            "no checkpoint was written before this one: free space and run the command again"
        raise UserError(f"{exc}; {then}") from exc
    # MLflow gets every point up to the checkpoint once it is on disk, not before: a kill inside
    # the save then leaves MLflow short of points (a resume sends them, same run), never holding
    # points past the checkpoint it resumes from (which forces a rebuild under a new run id).
    run.tracker.flush()
    return path


def evaluate(run: Run, tag: str = "final", kind: str = "") -> Any:
    """Evaluation of the current policy on the held-out seeds (``eval.episodes`` from ``eval.seed``);
    ``eval.video=N`` records N episodes under videos/<tag>/. ``kind="validation"``: on the
    validation seeds instead (eval.best); ``kind="best"``: of the kept checkpoint. Those two show
    no text examples and record no video."""
    cfg = run.cfg
    text = run.world.modality == "text"
    episodes, seed = (validation_episodes(cfg, text), int(cfg.eval.val_seed)) if kind == "validation" else \
        (int(cfg.eval.episodes), int(cfg.eval.seed))
    policy = str(run.ctx.run_dir / "checkpoints" / "best") if kind == "best" else run.policy
    ev = run.world.evaluator.evaluate(policy, episodes, seed, bool(cfg.eval.get("deterministic", True)),
                                      label=f"{cfg.algo.name} ({kind})" if kind else str(cfg.algo.name),
                                      examples=0 if kind else int((cfg.get("text") or {}).get("examples", 8)),
                                      video=0 if kind else int(cfg.eval.get("video", 0) or 0),
                                      video_dir=run.ctx.run_dir / "videos" / tag,
                                      video_size=int(cfg.eval.get("video_size", 256)))
    for f in ev.extra.get("videos", []):
        run.tracker.log_artifact(Path(f), f"videos/{tag}")
    return ev


def evaluations(run: Run, eval_every: int, best: bool, last: bool = False) -> dict[str, float]:
    """The evaluations due after this iteration (or before the first): every ``eval.interval``
    iterations the held-out one (the curve), and with ``eval.best`` a validation, which also runs
    before the first update and after the ``last`` (both policies are candidates) whatever the
    interval."""
    it, metrics = run.state["iteration"], {}
    due = bool(eval_every) and it % eval_every == 0
    if due and run.rank == 0:
        metrics.update(evaluate(run, f"iter_{it:06d}").metrics)
    if best and (due or last or it == 0) and (run.state.get("val_last") or {}).get("iteration") != it:
        metrics.update(keep.keep_best(run, evaluate))
    return metrics


def train(run: Run, progress: Any) -> None:
    """The loop, with periodic evaluation and checkpoints."""
    from rlinf_cli import checkpoint as ckpt
    from rlinf_cli.runtime.workers import EnvWorkerError

    cfg, state = run.cfg, run.state
    interval, eval_every = max(1, int(cfg.checkpoint.interval)), int(cfg.eval.interval)
    best = bool(cfg.eval.get("best"))
    total = run.world.rollout.budget()
    try:
        for line in run.world.rollout.start(run.policy, run.algo, run.rank, run.world_size, state, run.saved):
            run.ctx.note(line)
        norm = getattr(getattr(run.world.rollout, "env", None), "normalizer", None)  # decided by start (auto)
        if run.demos is not None and norm is not None and norm.keys:
            run.demos.normalize_with(norm)  # the datasets hold raw observations; the policy reads normalized ones
            run.ctx.note(f"demonstrations: observations {norm.keys} normalized as the run's")
        if state["iteration"] == 0 and (eval_every or best):  # where the curve starts; the start is a candidate
            run.tracker.log_metrics(evaluations(run, eval_every, best) | {"iteration": 0.0}, 0)
        while run.world.rollout.units(state) < total:
            before = run.step()
            metrics = iterate(run)
            metrics.update(evaluations(run, eval_every, best, last=run.world.rollout.units(state) >= total))
            run.tracker.log_metrics(metrics, run.step())
            info = run.world.rollout.info(metrics)
            progress.update(run.step() - before, f"iter {state['iteration']}" + (f"  {info}" if info else ""))
            if state["iteration"] % interval == 0:
                checkpoint(run, f"iter_{state['iteration']:06d}")
                if run.rank == 0:
                    ckpt.prune(run.ctx.run_dir / "checkpoints", int(cfg.checkpoint.keep))
        if best and (state.get("val_last") or {}).get("iteration") != state["iteration"]:  # resumed at the end
            run.tracker.log_metrics(evaluations(run, 0, best, last=True), run.step())
    except KeyboardInterrupt:
        progress.close()  # what was saved is said by run(), in the CLI's one line
        raise
    except EnvWorkerError as exc:
        if not exc.server_lost:
            raise
        # the error says to restart the env server and resume: name the command, on its one line
        progress.close()
        last = ckpt.latest(run.ctx.run_dir / "checkpoints")
        raise EnvWorkerError(f"{exc}: rlinf rl resume={last}" if last else f"{exc} (none was written yet: start the run again)",
                             server_lost=True) from exc
    finally:
        run.world.close()
    progress.close()


def finish(run: Run) -> dict[str, Any]:
    """Final checkpoint and evaluation, result.json, table and learning curve."""
    from rlinf_cli.runtime.dist import shutdown

    cfg, ctx = run.cfg, run.ctx
    with run.engine.full_parameters():
        final_dir = checkpoint(run, "final")
        ev = evaluate(run) if run.rank == 0 else None
    run.engine.close()
    shutdown()
    summary = ev.summary if ev is not None else {}
    result = {"stage": "rl", "modality": run.world.modality, "run_dir": str(ctx.run_dir),
              "checkpoint": str(final_dir), "env_steps": run.state["env_steps"], "iterations": run.state["iteration"],
              "backend": run.engine.backend, "world_size": run.world_size, "seconds": round(time.time() - ctx.started, 2),
              "eval": summary, "mlflow_run_id": run.tracker.run_id}
    rows = {f"{cfg.algo.name} ({run.step():,} {run.world.unit})": summary}
    # the kept policy (eval.best), on the same held-out seeds as the final one: one row of metrics
    kept = keep.report(run, evaluate, ev, result, rows) if run.rank == 0 else {}
    run.tracker.log_metrics({**(ev.metrics if ev else {}), **kept}, run.step())
    if (ctx.run_dir / "videos").is_dir():
        result["videos"] = sorted(str(f) for f in (ctx.run_dir / "videos").rglob("*.mp4"))
    x = "env_steps" if run.world.unit == "steps" else "iteration"
    table = run.world.evaluator.table(rows, f"rlinf rl: {run.world.label}") if summary else None  # eval.episodes=0: no table
    common.write_result(ctx, run.tracker, result, table,
                        (x, ["rollout/return_mean", "rollout/success_once", "rollout/reward_mean", "eval/return_mean",
                             "eval/accuracy", "val/success_once", "val/accuracy"],
                         f"rlinf rl {cfg.algo.name} on {run.world.label}"),
                        ev, show=run.rank == 0)
    if run.rank == 0:
        ctx.note(f"run: {ctx.run_dir}  checkpoint: {final_dir}")
        for line in keep.notes(run):
            ctx.note(line)
    return result


def stop_note(cfg: Any, run: Run | None) -> str:
    """What a stopped run kept, and the command that continues it."""
    from rlinf_cli import checkpoint as ckpt

    if run is None or run.tracker is None:
        if cfg.resume:
            return f"it had not started; resume with: rlinf rl resume={cfg.resume}"
        return "nothing was saved (the run had not started)"
    ckpts = run.ctx.run_dir / "checkpoints"
    written = [c for c in (ckpt.latest(ckpts), ckpts / "final") if c is not None and (c / ckpt.STATE_FILE).is_file()]
    last = max(written, key=lambda c: (c / ckpt.STATE_FILE).stat().st_mtime, default=None)
    if last is None:
        return (f"no checkpoint yet (the first comes after checkpoint.interval={int(cfg.checkpoint.interval)} "
                f"iterations); metrics so far are in {run.ctx.run_dir}")
    return f"the last checkpoint is {last}; resume with: rlinf rl resume={last}"


def run(cfg: Any) -> dict[str, Any]:
    r = None
    try:
        r = setup(cfg)
        r.cfg_yaml = to_yaml(cfg)
        tags = {**common.plugin_tags(cfg), "rlinf.modality": r.world.modality, "rlinf.backend": r.engine.backend}
        resumed = {"resume_run_id": r.state.get("mlflow_run_id"), "resume_step": r.step()} if cfg.resume else {}
        with r.ctx.track(cfg, tags, **resumed) as r.tracker, \
                Progress(r.ctx.log, f"rl {cfg.algo.name}", r.world.rollout.budget(), r.world.unit,
                         enabled=bool(cfg.progress)) as progress:
            progress.done = float(r.step())
            r.tracker.log_params({**flatten(cfg), "train.precision_used": r.engine.precision})  # measured, not asked
            note_recommended(r)
            train(r, progress)
            return finish(r)
    except KeyboardInterrupt as exc:  # SIGINT or SIGTERM
        common.stopped(exc, stop_note(cfg, r))
        raise
