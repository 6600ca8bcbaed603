"""Plumbing every stage shares: run directories, seeding, accelerators, checkpoints, results."""

from __future__ import annotations

import random
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from rlinf_cli.config import to_yaml
from rlinf_cli.errors import UserError
from rlinf_cli.locks import FileLock
from rlinf_cli.runtime import threads
from rlinf_cli.registry import GROUP_TO_KIND, get_registry
from rlinf_cli.tracking import Tracker, plot_curve


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


def start(cfg: Any, stage: str, label: str, run_dir: Path | None = None, accel: Any = None) -> RunContext:
    """Seed, set threads, pick the device and the run directory (created by ``ctx.open()``)."""
    import torch
    from rich.console import Console


    torch.set_num_threads(threads.initial(cfg.train.threads))
    seed_everything(int(cfg.seed))
    accel = accel or select_accelerator(cfg.accelerator.name)
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
        raise UserError("no accelerator is available; `rlinf doctor` lists the backends and how to install each")
    accel = reg.load("accelerator", name)()
    if not accel.is_available():
        raise UserError(f"accelerator '{name}' is not usable here: {accel.describe()}. Use accelerator=auto or accelerator=cpu")
    return accel


def plugin_tags(cfg: Any) -> dict[str, str]:
    """MLflow tags: which plugin (and package version) served each group."""
    reg = get_registry()
    from rlinf_cli import __version__

    tags = {"rlinf.version": __version__}
    for group, kind in GROUP_TO_KIND.items():
        node = cfg.get(group) if hasattr(cfg, "get") else None
        if node is None or node.get("name") in (None, "auto"):
            continue
        spec = reg.get(kind, node.get("name"))
        tags[f"plugin.{group}"] = f"{spec.name} ({spec.package} {spec.version})"
    return tags


def table_text(table: Any) -> str:
    """A rich table as plain text (for files, MLflow descriptions)."""
    import io

    from rich.console import Console

    rec = Console(record=True, width=120, file=io.StringIO())
    rec.print(table)
    return rec.export_text()


def write_result(ctx: RunContext, tracker: Any, result: dict[str, Any], table: Any = None,
                 curve: tuple[str, list[str], str] | None = None, ev: Any = None, show: bool = True) -> Path:
    """``result.json`` (+ the rendered table as ``eval_table.txt``, + ``learning_curve.png`` of
    ``curve = (x_key, y_keys, title)``) in the run dir and in MLflow; then, with ``show``, the
    table and the evaluation ``ev``'s examples (text tasks) on the console."""
    import json

    if ev is not None and "examples" in ev.extra:
        result.setdefault("examples", ev.extra["examples"])
    out = ctx.run_dir / "result.json"
    out.write_text(json.dumps(result, indent=2, default=str))
    tracker.log_artifact(ctx.run_dir / "rlinf.yaml")
    tracker.log_artifact(out)
    if table is not None:
        text = ctx.run_dir / "eval_table.txt"
        text.write_text(table_text(table))
        tracker.log_artifact(text)
    if curve is not None:
        png = plot_curve(tracker.history, curve[0], curve[1], ctx.run_dir / "learning_curve.png", curve[2])
        if png is not None:
            tracker.log_artifact(png)
    if show and table is not None:
        ctx.console.print(table)
        if ev is not None and ev.examples is not None:
            ctx.console.print(ev.examples)
    return out


def load_algorithm(cfg: Any, stage: str) -> Any:
    """The configured algorithm, checked to fit the stage (``sft`` learns from demonstrations)."""
    algo = get_registry().load("algorithm", cfg.algo.name).from_config(cfg.algo)
    if stage == "sft" and algo.rollout != "supervised":
        raise UserError(f"algorithm '{cfg.algo.name}' is an RL algorithm: `rlinf sft` needs a supervised one (algo=bc)")
    if stage == "rl" and algo.rollout == "supervised":
        raise UserError(f"algorithm '{cfg.algo.name}' learns from a dataset: use `rlinf sft`, not `rlinf rl`")
    return algo


def save_checkpoint(path: Path, policy: Any, cfg_yaml: str, engine: Any = None, state: dict[str, Any] | None = None,
                    generator: Any = None, rollout: Any = None, rank: int = 0) -> Path:
    """A resumable checkpoint: every rank hands in its rollout's state and RNGs (rank 0 writes
    them, and the rollout's files: normalization statistics), and the engine its optimizer
    state; the policy's weights come whole from rank 0."""
    from rlinf_cli import checkpoint as ckpt
    from rlinf_cli.runtime.dist import gather_to_first

    mine: dict[str, Any] = dict(rollout.state()) if rollout is not None and state is not None else {}
    if rank > 0 and state is not None:
        mine.update({f"rng.{k}": v for k, v in ckpt.rng_state(generator).items()})
    states = gather_to_first(mine) if state is not None else []
    return ckpt.save(path, policy, cfg_yaml, engine, state, generator, states if any(states) else None, rank,
                     rollout.save_files if rollout is not None else None)


def stopped(exc: BaseException, saved: str) -> None:
    """Record on a stop (SIGINT or SIGTERM: a KeyboardInterrupt) what the stage kept and how to go
    on; the CLI prints it in its one line ``stopped by SIGTERM: <saved>``. The innermost stage
    that knows says it (a pipeline adds its own part around it)."""
    if not getattr(exc, "saved", ""):
        exc.saved = saved  # type: ignore[attr-defined]


def resume(path: Path, engine: Any, generator: Any, rank: int) -> tuple[dict[str, Any], dict[str, np.ndarray] | None]:
    """Load a checkpoint's progress, optimizer and RNGs; returns (progress state, this rank's saved
    rollout arrays or None)."""
    import torch

    from rlinf_cli import checkpoint as ckpt

    state = ckpt.load_training_state(path, engine, generator)
    saved = ckpt.load_rank_state(path, rank)
    if saved is not None and rank > 0:  # its own RNG streams (rank 0's are in rng.safetensors)
        ckpt.set_rng_state({k[4:]: torch.from_numpy(v) for k, v in saved.items() if k.startswith("rng.")}, generator)
    return state, saved

