"""Weight sync by broadcast (``placement.generation.sync=broadcast``): the trainer and its generation
workers in a process group of their own, the trainer rank 0, worker ``w`` rank ``w + 1``.

The group is not torch.distributed's default one: the trainer may already be a rank of its own
training group (torchrun, executor-started ranks), and a process has one default group. So each
member builds a ``TCPStore`` (the trainer hosts it) and a gloo or NCCL process-group object from it
directly. Each publish sends the trainable tensors packed into one flat buffer per dtype (the
layout :class:`~rlinf_cli.runtime.shm.SharedTensors` uses), so a 135M model is one or two
collective calls, not one per tensor. Gloo moves CPU tensors (any machines); NCCL moves GPU tensors
between GPUs (a trainer and workers on CUDA devices), without a host copy.

A broadcast is collective: every member takes part at once, so the pool runs one only while no
worker has a request in flight (before sending a request that needs newer weights), and builds the
group again, on a new port, when a worker was restarted (a fresh process is not a member).
"""

from __future__ import annotations

import datetime
import math
import socket
from dataclasses import dataclass
from typing import Any, Mapping

Layout = list[tuple[str, str, tuple[int, ...]]]  # (name, dtype name, shape), in the order packed


@dataclass(frozen=True)
class GroupAddress:
    """Where the group meets and who is who: sent to each worker when it joins."""

    host: str
    port: int
    size: int  # the trainer and every worker
    backend: str  # gloo | nccl
    timeout_s: float
    layout: Layout


def layout_of(tensors: Mapping[str, Any]) -> Layout:
    return [(name, str(t.dtype).removeprefix("torch."), tuple(t.shape)) for name, t in tensors.items()]


def free_port(host: str) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def open_group(address: GroupAddress, rank: int) -> Any:
    """This member's process-group object (rank 0 hosts the store and waits for the others)."""
    import torch.distributed as dist

    timeout = datetime.timedelta(seconds=float(address.timeout_s))
    store = dist.TCPStore(address.host, address.port, address.size, rank == 0, timeout=timeout)
    if address.backend == "nccl":
        options = dist.ProcessGroupNCCL.Options()
        options._timeout = timeout
        return dist.ProcessGroupNCCL(store, rank, address.size, options)
    return dist.ProcessGroupGloo(store, rank, address.size, timeout)


class FlatBuffers:
    """The tensors of a layout as one flat buffer per dtype on ``device``, with views by name."""

    def __init__(self, layout: Layout, device: str):
        import torch

        sizes: dict[str, int] = {}
        places: list[tuple[str, str, int, tuple[int, ...]]] = []
        for name, dtype, shape in layout:
            offset = sizes.get(dtype, 0)
            places.append((name, dtype, offset, shape))
            sizes[dtype] = offset + math.prod(shape)
        self.buffers = {d: torch.empty(n, dtype=getattr(torch, d), device=device) for d, n in sizes.items()}
        self.views = {name: self.buffers[d][o:o + math.prod(shape)].view(shape) for name, d, o, shape in places}

    def broadcast(self, group: Any) -> None:
        """Rank 0's buffers to every member (in place)."""
        for d in sorted(self.buffers):  # the same order on every member
            group.broadcast(self.buffers[d], 0).wait()


class Sender:
    """The trainer's side: the group's rank 0."""

    def __init__(self, address: GroupAddress, device: str):
        self.address = address
        self.flat = FlatBuffers(address.layout, device)
        self.group: Any = None

    def open(self) -> None:
        """Join as rank 0 (call after every worker was asked to join: rank 0 waits for them)."""
        self.group = open_group(self.address, 0)

    def close(self) -> None:
        """Leave the group: its connections close, so a member still waiting in a broadcast that
        failed raises now instead of at the timeout (measured: the group object's abort() and
        shutdown() did not end such a wait; dropping the object did). Call outside the ``except``
        block of the failure: its traceback holds the group until the block ends."""
        self.group = None

    def send(self, tensors: Mapping[str, Any]) -> None:
        import torch

        with torch.no_grad():
            for name, view in self.flat.views.items():
                view.copy_(tensors[name])
        self.flat.broadcast(self.group)


class Receiver:
    """A worker's side: rank ``rank`` of the group."""

    def __init__(self, address: GroupAddress, rank: int, device: str):
        self.flat = FlatBuffers(address.layout, device)
        self.group = open_group(address, rank)

    def receive(self) -> Mapping[str, Any]:
        """The tensors rank 0 sends now, as views into this member's buffers."""
        self.flat.broadcast(self.group)
        return self.flat.views


def check_layout(mine: Layout, theirs: Layout) -> None:
    """A worker's policy must have the trainer's trainable tensors, in the same order and shapes."""
    if mine != theirs:
        diff = next((f"{a} vs {b}" for a, b in zip(mine, theirs) if a != b), f"{len(mine)} vs {len(theirs)} tensors")
        raise RuntimeError(f"the generation worker's trainable tensors differ from the trainer's: {diff}")
