"""Trainer ranks started by an executor (``placement.trainer.ranks``): the driver's side and each rank's.

``rlinf rl executor=ray placement.trainer.ranks=K`` does not train in the process it was typed in:
that process (the driver) hands the executor a :class:`RankJob`, the executor starts K ranks where
it places them (Ray actors in one placement group) and each rank gets the variables torchrun gives
its ranks (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR``, ``MASTER_PORT``) and runs
:func:`run_rank`: the same stage on the same config, joining the same process group
(``runtime/dist.py: setup_ranks``). So K ranks placed by an executor train exactly as
``torchrun --nproc_per_node=K`` does with the same seeds; rank 0 alone writes the run directory.

A rank that dies ends the run with one line that names the checkpoint to resume from (the
executor raises :class:`RankDied`; :func:`launch` words it).
"""

from __future__ import annotations

import importlib
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from rlinf_cli import settings
from rlinf_cli.checkpoint import STATE_FILE, latest
from rlinf_cli.errors import UserError
from rlinf_cli.stages.common import make_run_dir, resumed_run_dir, stopped

STRATEGIES = ("PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD")  # Ray's placement group strategies


@dataclass(frozen=True)
class TrainerPlacement:
    """``placement.trainer``: how many trainer ranks and what each reserves."""

    ranks: int = 1  # 1 = this process (or each torchrun rank); K > 1: the executor starts K ranks
    cpus: float = 1.0  # CPUs each rank reserves
    gpus: float = 0.0  # GPUs each rank reserves
    memory_gb: float = 0.0  # memory each rank reserves (0 = no reservation)
    resources: dict[str, float] = field(default_factory=dict)  # custom resources each rank reserves (Ray)
    strategy: str = "PACK"  # how ranks spread over nodes: PACK | SPREAD | STRICT_PACK | STRICT_SPREAD

    def __post_init__(self) -> None:
        if self.ranks < 1:
            raise ValueError(f"placement.trainer.ranks must be >= 1, got {self.ranks}")
        if min(self.cpus, self.gpus, self.memory_gb, *self.resources.values()) < 0:
            raise ValueError("placement.trainer reservations (cpus, gpus, memory_gb, resources) must be >= 0")
        if self.strategy not in STRATEGIES:
            raise ValueError(f"placement.trainer.strategy must be one of {', '.join(STRATEGIES)}, got '{self.strategy}'")

    @property
    def bundle(self) -> dict[str, float]:
        """What one rank reserves, in Ray's resource names (zero amounts left out)."""
        out = {"CPU": self.cpus, "GPU": self.gpus, "memory": self.memory_gb * 2**30, **self.resources}
        return {k: float(v) for k, v in out.items() if v}


@dataclass(frozen=True)
class RankJob:
    """What an executor needs to start a stage's trainer ranks."""

    stage: str  # the stage each rank runs ("rl")
    config_yaml: str  # the composed, resolved config; rank 0's run directory fixed (run_dir)
    trainer: TrainerPlacement
    cwd: str  # the driver's working directory: relative paths (runs_dir, init=) mean the same on every rank
    run_dir: str  # where rank 0 writes the run (absolute)
    generation: Any = None  # placement.generation (GenerationPlacement): each rank's generation workers (API 1.4)

    @property
    def ranks(self) -> int:
        return self.trainer.ranks

    def rank_env(self, rank: int, local_rank: int, local_world: int, master_addr: str, master_port: int) -> dict[str, str]:
        """The variables torchrun gives rank ``rank`` (what ``setup_ranks`` reads to join the group)."""
        return {"RANK": str(rank), "WORLD_SIZE": str(self.ranks), "LOCAL_RANK": str(local_rank),
                "LOCAL_WORLD_SIZE": str(local_world), "GROUP_RANK": "0", "MASTER_ADDR": master_addr,
                "MASTER_PORT": str(master_port)}


class RankDied(Exception):
    """A trainer rank's process or node is gone (raised by an executor's ``start_ranks``)."""

    def __init__(self, rank: int, reason: str):
        super().__init__(f"trainer rank {rank} died: {reason}")
        self.rank = rank
        self.reason = reason


def trainer_placement(cfg: Any) -> TrainerPlacement:
    node = (cfg.get("placement") or {}).get("trainer")
    return settings.build(TrainerPlacement, node, "placement.trainer")


def launch(stage: str, cfg: Any) -> dict[str, Any] | None:
    """Start ``stage`` as ``placement.trainer.ranks`` ranks through the executor and wait for them;
    None when this process trains itself (one rank, or a rank already: torchrun, an executor)."""
    trainer = trainer_placement(cfg)
    if trainer.ranks <= 1:
        return None
    if "WORLD_SIZE" in os.environ:  # torchrun (or an executor) started this process as a rank
        if int(os.environ["WORLD_SIZE"]) != trainer.ranks:
            raise UserError(f"placement.trainer.ranks={trainer.ranks} under torchrun with {os.environ['WORLD_SIZE']} "
                            f"ranks: torchrun starts the ranks itself; leave placement.trainer.ranks=1")
        return None
    from rlinf_cli.collectors.embodied_env import make_executor, transport_options

    executor = make_executor(cfg.executor, transport_options(cfg.get("runtime"), cfg.get("env")))
    start = getattr(executor, "start_ranks", None)
    if start is None:
        raise UserError(f"executor={cfg.executor.name} does not start trainer ranks: use executor=ray (or local) with "
                        f"placement.trainer.ranks={trainer.ranks}, or torchrun --nproc_per_node={trainer.ranks} "
                        f"$(which rlinf) {stage} ... with placement.trainer.ranks=1")
    job = rank_job(stage, cfg, trainer)
    try:
        return start(job)
    except RankDied as exc:
        raise UserError(f"{exc}; the run stopped, {resume_note(Path(job.run_dir))}") from None
    except KeyboardInterrupt as exc:  # SIGINT or SIGTERM of this process: the executor stopped the ranks
        stopped(exc, resume_note(Path(job.run_dir)))
        raise


def rank_job(stage: str, cfg: Any, trainer: TrainerPlacement) -> RankJob:
    """The job, with rank 0's run directory decided here, so this process can name its checkpoints."""
    from omegaconf import OmegaConf, open_dict

    resume = Path(cfg.resume) if cfg.get("resume") else None
    run_dir = resumed_run_dir(cfg, resume) or make_run_dir(cfg, stage, f"{cfg.sim.name}-{cfg.algo.name}")
    from rlinf_cli.runtime.generation import GenerationPlacement

    with open_dict(cfg):
        cfg.run_dir = str(Path(run_dir).resolve())
    node = (cfg.get("placement") or {}).get("generation")
    generation = settings.build(GenerationPlacement, node, "placement.generation") if node is not None else None
    return RankJob(stage, OmegaConf.to_yaml(cfg, resolve=True), trainer, os.getcwd(), cfg.run_dir, generation)


def resume_note(run_dir: Path) -> str:
    last = latest(run_dir / "checkpoints")
    if last is None or not (last / STATE_FILE).is_file():
        return f"before its first checkpoint (metrics so far are in {run_dir})"
    return f"resume with: rlinf rl resume={last}"


def run_rank(job: RankJob, env: Mapping[str, str]) -> dict[str, Any] | None:
    """One trainer rank, in the process an executor started for it: take the rank's variables, run
    the stage; rank 0's result comes back."""
    from omegaconf import OmegaConf

    os.environ.update(env)
    if os.path.isdir(job.cwd):  # a node without the driver's directory keeps its own (absolute paths still work)
        os.chdir(job.cwd)
    cfg = OmegaConf.create(job.config_yaml)
    OmegaConf.set_struct(cfg, True)  # as Hydra composes it: a misspelt key fails, not reads None
    result = importlib.import_module(f"rlinf_cli.stages.{job.stage}").run(cfg)
    return result if env.get("RANK") == "0" else None
