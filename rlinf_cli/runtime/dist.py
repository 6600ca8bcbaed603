"""The process group: rank helpers every stage shares, in one process or under torchrun.

Outside torchrun every helper is a no-op on one rank (``world() == (0, 1)``), so the stages call
them unconditionally. On CPU the process group uses gloo (the accelerator names the backend).
"""

from __future__ import annotations

import os
import socket
import tempfile
from typing import Any

import torch


def world() -> tuple[int, int]:
    """``(rank, world_size)`` of this process; ``(0, 1)`` outside torchrun."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_rank(), torch.distributed.get_world_size()
    return int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))


def setup_ranks(cfg: Any, accelerator: Any) -> tuple[int, int]:
    """Join torchrun's process group when there is one (or DeepSpeed needs one); every rank but 0
    trains quietly and keeps its files out of the run directory. Returns ``(rank, world)``."""
    backend = str((cfg.get("train") or {}).get("backend", "torch") or "torch")
    if backend == "torch" and int(os.environ.get("WORLD_SIZE", "1")) <= 1:
        return 0, 1
    rank, size = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
    if size > 1 and not torch.distributed.is_initialized():
        if hasattr(accelerator, "set_device"):
            accelerator.set_device()  # LOCAL_RANK -> this process's device, before nccl/hccl bind to one
        torch.distributed.init_process_group(backend=accelerator.dist_backend())
    if rank > 0:
        cfg.tracking.enabled = False
        cfg.progress = False
        cfg.quiet = True
        cfg.run_dir = tempfile.mkdtemp(prefix=f"rlinf-rank{rank}-")
    return rank, size


def gather_to_first(obj: Any) -> list[Any]:
    """Every rank's ``obj``, as a list on rank 0 (``[]`` elsewhere); ``[obj]`` in one process."""
    rank, size = world()
    if size <= 1 or not (torch.distributed.is_available() and torch.distributed.is_initialized()):
        return [obj]
    out: list[Any] | None = [None] * size if rank == 0 else None
    torch.distributed.gather_object(obj, out, dst=0)
    return out or []


def broadcast_from_first(obj: Any) -> Any:
    """Rank 0's ``obj`` on every rank (a decision only rank 0 can take); ``obj`` in one process."""
    if not (torch.distributed.is_available() and torch.distributed.is_initialized()) or world()[1] <= 1:
        return obj
    box = [obj]
    torch.distributed.broadcast_object_list(box, src=0)
    return box[0]


def barrier() -> None:
    """Wait for every rank (a no-op in one process)."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.barrier()


def shutdown() -> None:
    """Barrier and destroy the process group (without it, rank 1 can abort at exit)."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.barrier()
        torch.distributed.destroy_process_group()


def free_port() -> int:
    """A free TCP port on loopback (the rendezvous of a one-process DeepSpeed group)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
