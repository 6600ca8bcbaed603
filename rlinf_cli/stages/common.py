"""Plumbing every stage shares: run directories, seeding, plugin construction, evaluation."""

from __future__ import annotations

import random
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from rlinf_cli.api import EnvSpec, Executor, Obs, Simulator
from rlinf_cli.errors import UserError
from rlinf_cli.registry import get_registry
from rlinf_cli.settings import plain
from rlinf_cli.runtime.rollout import EpisodeStats, Recorder, run_episodes


@dataclass
class RunContext:
    stage: str
    run_dir: Path
    device: Any  # torch.device
    accelerator: Any
    console: Any  # rich Console for results (stdout)
    log: Any  # rich Console for progress and notes (stderr)
    cfg_yaml: str = ""
    started: float = field(default_factory=time.time)
    # run_dir was picked here (<runs_dir>/<stage>/<time>-<label>): open() takes the next free name
    auto_dir: bool = False
    continues: bool = False  # run_dir holds this run already (resume): it may exist
    _lock: Any = None
    _created: bool = False

    def note(self, msg: str) -> None:
        self.log.print(msg, highlight=False)

    def open(self) -> Path:
        """Create the run directory, lock it for this process and save the resolved config.

        Stages call this once their inputs are validated, so a run rejected for bad input leaves
        nothing behind. Runs started in the same second get distinct directories (creation is
        exclusive); a directory another live process holds is refused.
        """
        if self._lock is not None:
            return self.run_dir
        from rlinf_cli.locks import FileLock

        try:
            if self.auto_dir:
                self.run_dir = create_unique(self.run_dir)
                self._created = True
            else:
                if (self.run_dir / "rlinf.yaml").exists() and not self.continues:
                    raise UserError(f"run_dir '{self.run_dir}' already holds a run; choose a new run_dir "
                                    f"(or continue that run with resume=<its checkpoint>)")
                self._created = not self.run_dir.exists()
                self.run_dir.mkdir(parents=True, exist_ok=True)
            self._lock = FileLock(self.run_dir / ".lock").acquire(
                blocking=False, busy=f"run directory '{self.run_dir}' is in use by another rlinf process (pid {{pid}}); "
                                     f"wait for it to finish or choose another run_dir")
            (self.run_dir / "rlinf.yaml").write_text(self.cfg_yaml)
        except OSError as exc:
            raise UserError(f"cannot create the run directory '{self.run_dir}': {exc.strerror}; "
                            f"choose a writable runs_dir=... (or run_dir=...)") from exc
        return self.run_dir

    def track(self, cfg: Any, tags: dict[str, str], resume_run_id: str | None = None,
              resume_step: int | None = None) -> Any:
        """Open the run directory and start tracking it (a :class:`~rlinf_cli.tracking.Tracker`).

        If the tracking store refuses (read-only, damaged, disk full), a run directory made just
        now is removed again: a failed start leaves nothing behind.
        """
        from rlinf_cli.tracking import Tracker

        self.open()
        try:
            tracker = Tracker(cfg, self.run_dir, self.stage, tags, resume_run_id, resume_step)
        except BaseException:
            if self._created:
                import shutil

                self._lock.release()
                self._lock = None
                shutil.rmtree(self.run_dir, ignore_errors=True)
            raise
        for line in tracker.notes:
            self.note(line)
        return tracker


def create_unique(base: Path) -> Path:
    """``base``, or ``base-1``, ``base-2``, ...: the first name this process creates itself."""
    run_dir, i = base, 1
    try:
        base.parent.mkdir(parents=True, exist_ok=True)
        while True:
            try:
                run_dir.mkdir()
                return run_dir
            except FileExistsError:
                run_dir = base.with_name(f"{base.name}-{i}")
                i += 1
    except OSError as exc:
        raise UserError(f"cannot create the run directory '{run_dir}': {exc.strerror}; "
                        f"choose a writable runs_dir=... (or run_dir=...)") from exc


def resumed_run_dir(cfg: Any, resume_dir: Path | None) -> Path | None:
    """Where a resumed run continues: the checkpoint's own run directory, unless ``run_dir=``
    names another one (None: a new directory)."""
    if resume_dir is None:
        return None
    own = resume_dir.parent.parent
    if not (own / "rlinf.yaml").exists() or (cfg.run_dir and Path(cfg.run_dir).resolve() != own.resolve()):
        return None
    return own


def make_run_dir(cfg: Any, stage: str, label: str) -> Path:
    """The run directory's path (not created): ``run_dir`` or ``<runs_dir>/<stage>/<time>-<label>``."""
    if cfg.run_dir:
        return Path(cfg.run_dir)
    return Path(cfg.runs_dir) / stage / f"{time.strftime('%Y%m%d-%H%M%S')}-{label}"


def seed_everything(seed: int) -> None:
    import torch

    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def start(cfg: Any, stage: str, label: str, run_dir: Path | None = None) -> RunContext:
    """Seed, set threads, pick the device and the run directory (created by ``ctx.open()``)."""
    import torch
    from rich.console import Console

    from rlinf_cli.config import to_yaml

    torch.set_num_threads(int(cfg.train.threads))
    seed_everything(int(cfg.seed))
    accel = select_accelerator(cfg.accelerator.name)
    console = Console(quiet=False)
    log = Console(stderr=True, quiet=bool(cfg.quiet))
    path = run_dir or make_run_dir(cfg, stage, label)
    return RunContext(stage, path, accel.device(), accel, console, log, to_yaml(cfg),
                      auto_dir=run_dir is None and not cfg.run_dir, continues=run_dir is not None)


def select_accelerator(name: str) -> Any:
    reg = get_registry()
    if name == "auto":
        specs = sorted(reg.specs("accelerator").values(), key=lambda s: -int(s.attrs.get("priority", 0)))
        for spec in specs:
            accel = spec.load()()
            if accel.is_available():
                return accel
        raise UserError("no accelerator plugin is available; install rlinf-accelerators")
    accel = reg.load("accelerator", name)()
    if not accel.is_available():
        raise UserError(f"accelerator '{name}' is not usable here: {accel.describe()}. Use accelerator=auto or accelerator=cpu")
    return accel


def make_simulator(node: Any) -> Simulator:
    data = dict(plain(node))
    return get_registry().load("simulator", data["name"])(data)


def make_executor(node: Any, runtime: dict[str, Any] | None = None) -> Executor:
    """Build the executor; ``runtime`` (from :func:`runtime_options`) goes in as its ``runtime`` entry."""
    data = dict(plain(node))
    if runtime is not None:
        data["runtime"] = dict(runtime)
    return get_registry().load("executor", data["name"])(data)


def runtime_options(cfg: Any, act: Callable | None = None, spec: EnvSpec | None = None,
                    num_envs: int | None = None) -> dict[str, Any]:
    """The ``runtime`` and ``env`` transport settings as one dict for the executor.

    With ``runtime.mode=auto`` and a policy ``act`` function, the policy's inference time on a
    batch of ``num_envs`` is measured here (``infer_s``); the executor probes the simulator.
    """
    out: dict[str, Any] = dict(plain(cfg.runtime)) if cfg.get("runtime") is not None else {}
    env = cfg.get("env")
    if env is not None:
        out.update({"obs_compression": env.get("obs_compression", "none"), "obs_delta": bool(env.get("obs_delta", False)),
                    "compression_level": int(env.get("compression_level", 1))})
    if out.get("mode") == "auto" and act is not None and spec is not None and num_envs:
        from rlinf_cli.runtime.placement import time_inference

        out["infer_s"] = time_inference(act, spec, int(num_envs))
    return out


def plugin_tags(cfg: Any) -> dict[str, str]:
    """MLflow tags: which plugin (and package version) served each group."""
    reg = get_registry()
    from rlinf_cli import __version__
    from rlinf_cli.registry import GROUP_TO_KIND

    tags = {"rlinf.version": __version__}
    for group, kind in GROUP_TO_KIND.items():
        node = cfg.get(group) if hasattr(cfg, "get") else None
        if node is None or node.get("name") in (None, "auto"):
            continue
        spec = reg.get(kind, node.get("name"))
        tags[f"plugin.{group}"] = f"{spec.name} ({spec.package} {spec.version})"
    return tags


def training_seeds(seed: int, key: int, n: int) -> list[int]:
    """Env seeds for training segment ``key``: a deterministic hash, kept below the eval range."""
    state = np.random.SeedSequence([int(seed), int(key)]).generate_state(n)
    return [int(s) % 1_000_000 for s in state]


# -- actors (policy -> env actions) ----------------------------------------------------------
def random_actor(spec: EnvSpec, rng: np.random.Generator) -> Callable[[Obs], tuple[None, np.ndarray]]:
    def act(obs: Obs) -> tuple[None, np.ndarray]:
        n = next(iter(obs.values())).shape[0]
        if spec.discrete:
            return None, rng.integers(0, spec.num_actions, size=n)
        low = spec.action.low if spec.action.low is not None else -1.0
        high = spec.action.high if spec.action.high is not None else 1.0
        return None, rng.uniform(low, high, size=(n, *spec.action.shape)).astype(np.float32)

    return act


def expert_actor(simulator: Simulator) -> Callable[[Obs], tuple[None, np.ndarray]]:
    expert = simulator.expert()
    if expert is None:
        raise UserError("this simulator has no scripted expert; use policy=random or a checkpoint directory")

    def act(obs: Obs) -> tuple[None, np.ndarray]:
        n = next(iter(obs.values())).shape[0]
        return None, np.stack([expert({k: v[i] for k, v in obs.items()}, i) for i in range(n)])

    return act


def checkpoint_actor(path: str, spec: EnvSpec, device: Any, deterministic: bool) -> tuple[Any, Callable]:
    from rlinf_cli.policy import check_compatible, load_policy
    from rlinf_cli.runtime.rollout import policy_actor

    policy = load_policy(path, device)
    check_compatible(policy, spec, f"checkpoint '{path}'")
    policy.eval()
    return policy, policy_actor(policy, spec, device, deterministic)


def make_actor(policy: str, simulator: Simulator, device: Any, deterministic: bool, seed: int) -> Callable:
    if policy == "random":
        return random_actor(simulator.spec, np.random.default_rng(seed))
    if policy == "expert":
        return expert_actor(simulator)
    return checkpoint_actor(policy, simulator.spec, device, deterministic)[1]


# -- evaluation --------------------------------------------------------------------------------
def evaluate(
    act: Callable,
    simulator: Simulator,
    executor: Executor,
    episodes: int,
    seed: int,
    num_envs: int,
    recorder_factory: Callable[[], Recorder] | None = None,
    on_batch: Callable[[list[EpisodeStats]], None] | None = None,
) -> list[EpisodeStats]:
    """Episodes ``seed, seed+1, ...`` in batches of ``num_envs``; returns them in seed order."""
    if episodes < 1:
        return []
    n = max(1, min(num_envs, episodes))
    env = executor.make_vec_env(simulator, n, autoreset=False)
    results: list[EpisodeStats] = []
    try:
        for start_ in range(0, episodes, n):
            seeds = [seed + start_ + i for i in range(n)]
            batch = run_episodes(env, act, seeds, recorder_factory() if recorder_factory else None)
            batch = batch[: episodes - start_]
            results.extend(batch)
            if on_batch is not None:
                on_batch(batch)
    finally:
        env.close()
    return results


def summarize(episodes: Sequence[EpisodeStats], has_success: bool = True) -> dict[str, float]:
    """Mean/std return, success rates (only where the simulator reports success), mean length."""
    if not episodes:
        return {}
    rets = np.array([e.ret for e in episodes])
    out = {"episodes": float(len(episodes)), "return_mean": float(rets.mean()), "return_std": float(rets.std())}
    if has_success:
        out["success_once"] = float(np.mean([e.success_once for e in episodes]))
        out["success_at_end"] = float(np.mean([e.success_at_end for e in episodes]))
    out["length_mean"] = float(np.mean([e.length for e in episodes]))
    return out


def summarize_by_task(episodes: Sequence[EpisodeStats], tasks: Sequence[str],
                      has_success: bool = True) -> dict[str, dict[str, float]]:
    """Task name -> :func:`summarize` of its episodes, for simulators with several tasks."""
    out = {}
    for index, name in enumerate(tasks):
        mine = [e for e in episodes if e.task == index]
        if mine:
            out[name] = summarize(mine, has_success)
    return out


def task_mean(per_task: dict[str, dict[str, float]]) -> dict[str, float]:
    """Each number averaged over tasks (every task weighs the same, whatever its episode count)."""
    if not per_task:
        return {}
    keys = set.intersection(*(set(s) for s in per_task.values()))
    out = {k: float(np.mean([s[k] for s in per_task.values()])) for k in sorted(keys)}
    out["episodes"] = float(sum(s["episodes"] for s in per_task.values()))
    out["tasks"] = float(len(per_task))
    return out


def pct(summary: dict[str, float], key: str) -> str:
    return f"{summary[key]:.0%}" if key in summary else "n/a"


def eval_table(rows: dict[str, dict[str, float]], title: str) -> Any:
    """A rich table: one row per policy/label with the summary numbers."""
    from rich.table import Table

    table = Table(title=title)
    for col in ("policy", "episodes", "return (mean ± std)", "success_once", "success_at_end", "length"):
        table.add_column(col, justify="right" if col != "policy" else "left")
    for label, s in rows.items():
        if not s:
            table.add_row(label, "-", "-", "-", "-", "-")
            continue
        table.add_row(label, f"{int(s['episodes'])}", f"{s['return_mean']:.1f} ± {s['return_std']:.1f}",
                      pct(s, "success_once"), pct(s, "success_at_end"), f"{s['length_mean']:.1f}")
    return table


def write_result(ctx: RunContext, tracker: Any, result: dict[str, Any], table: Any = None,
                 curve: tuple[str, list[str], str] | None = None) -> Path:
    """``result.json`` (+ the rendered table as ``eval_table.txt``, + ``learning_curve.png`` of
    ``curve = (x_key, y_keys, title)``) in the run dir and in MLflow."""
    import json

    from rich.console import Console

    out = ctx.run_dir / "result.json"
    out.write_text(json.dumps(result, indent=2, default=str))
    tracker.log_artifact(ctx.run_dir / "rlinf.yaml")
    tracker.log_artifact(out)
    if table is not None:
        text = ctx.run_dir / "eval_table.txt"
        rec = Console(record=True, width=120, file=open("/dev/null", "w"))
        rec.print(table)
        text.write_text(rec.export_text())
        tracker.log_artifact(text)
    if curve is not None:
        from rlinf_cli.tracking import plot_curve

        png = plot_curve(tracker.history, curve[0], curve[1], ctx.run_dir / "learning_curve.png", curve[2])
        if png is not None:
            tracker.log_artifact(png)
    return out
