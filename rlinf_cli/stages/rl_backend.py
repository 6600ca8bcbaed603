"""Training backends for `rlinf rl` on embodied tasks: one process or many, torch or DeepSpeed.

- ``train.backend=torch`` in one process: a torch optimizer and the lean update of
  :func:`rlinf_cli.runtime.trainer.update` (the default; nothing distributed is imported).
- Under ``torchrun --nproc_per_node=K`` or with ``train.backend=deepspeed``: a training engine
  from :mod:`rlinf_cli.runtime.distributed` (gradients averaged over ranks every minibatch;
  DeepSpeed ZeRO ``train.zero_stage`` and bf16 where the accelerator supports it). Every rank
  steps its own envs on its own seeds, so K ranks collect K times the experience per
  iteration; rank 0 alone writes the run directory, checkpoints and tracking.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from typing import Any, Iterator

from rlinf_cli.errors import UserError


def _backend(cfg: Any) -> str:
    train = cfg.get("train") or {}
    return str(train.get("backend", "torch") or "torch")


def _distributed() -> Any:
    try:
        from rlinf_cli.runtime import distributed
    except ImportError as exc:  # pragma: no cover - the engine module ships with rlinf
        raise UserError("multi-process or DeepSpeed training needs rlinf_cli.runtime.distributed; reinstall rlinf") from exc
    return distributed


def setup_ranks(cfg: Any) -> tuple[int, int]:
    """Join torchrun's process group when there is one; quiet every rank but 0. ``(rank, world)``."""
    if _backend(cfg) == "torch" and int(os.environ.get("WORLD_SIZE", "1")) <= 1:
        return 0, 1
    from rlinf_cli.stages import common

    rank, world = _distributed().init_process_group(common.select_accelerator(cfg.accelerator.name))
    if rank > 0:  # one writer: the other ranks train but keep their files out of the run directory
        cfg.tracking.enabled = False
        cfg.progress = False
        cfg.quiet = True
        cfg.run_dir = tempfile.mkdtemp(prefix=f"rlinf-rank{rank}-")
    return rank, world


class Trainer:
    """The optimizer side of a run: what :func:`update` steps with, what checkpoints save."""

    def __init__(self, policy: Any, algo_cfg: Any, cfg: Any, accelerator: Any, world: int):
        from rlinf_cli.runtime.trainer import make_optimizer

        self.backend = _backend(cfg)
        self.engine: Any = None
        if self.backend == "torch" and world <= 1:
            self.optimizer = make_optimizer(policy, algo_cfg)
            self.handle: Any = self.optimizer
        else:
            self.engine = _distributed().make_engine(policy, algo_cfg, cfg.train, accelerator)
            self.optimizer = self.engine.checkpoint_optimizer()
            self.handle = self.engine

    def set_lr(self, lr: float) -> None:
        if self.engine is not None:
            self.engine.set_lr(lr)
        else:
            for group in self.optimizer.param_groups:
                group["lr"] = lr

    @property
    def lr(self) -> float:
        return float(self.engine.lr if self.engine is not None else self.optimizer.param_groups[0]["lr"])

    def checkpoint_optimizer(self) -> Any:
        """The optimizer a checkpoint saves (None where the backend cannot resume)."""
        return self.optimizer

    @contextlib.contextmanager
    def full_parameters(self) -> Iterator[None]:
        """Whole parameters on every rank (ZeRO-3 gathers them), e.g. to save or evaluate."""
        if self.engine is None:
            yield
        else:
            with self.engine.full_parameters():
                yield

    def close(self) -> None:
        if self.engine is not None:
            _distributed().shutdown()
