"""The worker side of generation workers: a policy rebuilt from its image, serving a job's requests
with the weights of the version each request names.

A generation worker (``placement.generation.workers``) is a process of this machine or a Ray actor
that holds its own copy of the trainer's policy. It is built once from a :class:`PolicyImage` (the
policy written by its own ``save_pretrained`` and read back by its class's ``from_pretrained``: the
same class, config, structure and weights, LoRA adapters and value heads included, whatever the
model), then receives only the tensors that train (:func:`trainable`) when a request names a newer
version: through :class:`SharedWeights` on this machine, or as the request's argument (the Ray
executor: the object store). What it runs with the policy is a job from the world that asked for it
(the text rollout's sampling: ``collectors/text_gen.py``), so nothing here knows about text.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from rlinf_cli.runtime.shm import SharedTensors
from rlinf_cli.runtime.weight_broadcast import Receiver, check_layout, layout_of


class GenerationJob(Protocol):
    """What a generation worker runs; pickled to the worker with its plan."""

    def start(self, policy: Any) -> None:
        """Once, in the worker, with the policy it built (tools, caches)."""
        ...

    def run(self, policy: Any, payload: Any) -> Any:
        """One request; the reply goes back to the driver."""
        ...

    def close(self) -> None: ...


@dataclass
class PolicyImage:
    """A policy as its ``save_pretrained`` wrote it: a directory on this machine, or its files packed
    to travel to another (:meth:`packed`, for executors whose workers cannot read this disk)."""

    policy_cls: type
    directory: str | None = None
    files: dict[str, bytes] = field(default_factory=dict)
    links: dict[str, str] = field(default_factory=dict)

    @classmethod
    def write(cls, policy: Any) -> "PolicyImage":
        directory = tempfile.mkdtemp(prefix="rlinf-generation-")
        policy.save_pretrained(directory)
        return cls(type(policy), directory)

    def packed(self) -> "PolicyImage":
        files: dict[str, bytes] = {}
        links: dict[str, str] = {}
        root = Path(str(self.directory))
        for p in sorted(root.rglob("*")):
            rel = str(p.relative_to(root))
            if p.is_symlink():
                links[rel] = os.readlink(p)
            elif p.is_file():
                files[rel] = p.read_bytes()
        return PolicyImage(self.policy_cls, None, files, links)

    def load(self, device: str) -> Any:
        """The policy, rebuilt in this process (a packed image is written to a directory of its own first)."""
        if self.directory is not None:
            return self.policy_cls.from_pretrained(self.directory, map_location=device)
        root = Path(tempfile.mkdtemp(prefix="rlinf-generation-"))
        try:
            for rel, data in self.files.items():
                (root / rel).parent.mkdir(parents=True, exist_ok=True)
                (root / rel).write_bytes(data)
            for rel, target in self.links.items():
                (root / rel).parent.mkdir(parents=True, exist_ok=True)
                os.symlink(target, root / rel)
            return self.policy_cls.from_pretrained(str(root), map_location=device)
        finally:  # the policy holds its weights in memory: its files are not needed again
            shutil.rmtree(root, ignore_errors=True)

    def remove(self) -> None:
        if self.directory is not None:
            shutil.rmtree(self.directory, ignore_errors=True)


def trainable(policy: Any) -> dict[str, Any]:
    """The tensors that change in training: parameters that require gradients (the optimizer's;
    with LoRA the adapter and value head only). Everything else a worker has from the image."""
    return {name: p for name, p in policy.named_parameters() if p.requires_grad}


class SharedWeights:
    """The trainable tensors in shared memory, for workers on this machine: written by the driver only
    while no request is in flight, read by a worker at the start of a request that names a newer version."""

    def __init__(self, policy: Any):
        # packed: one file descriptor per dtype reaches a worker, not one per tensor (runtime/shm.py)
        self.tensors = SharedTensors(trainable(policy))

    def write(self, policy: Any) -> None:
        self.tensors.write(trainable(policy))


def load_weights(policy: Any, tensors: dict[str, Any]) -> None:
    import torch

    params = dict(policy.named_parameters())
    missing = sorted(set(tensors) - set(params))
    if missing:
        raise RuntimeError(f"the generation worker's policy has no parameter {missing[0]!r}")
    with torch.no_grad():
        for k, v in tensors.items():
            params[k].copy_(v)


class GenerationWorker:
    """One generation worker (hosted by a process of this machine or an executor's actor)."""

    def __init__(self, image: PolicyImage, job: GenerationJob, threads: int, device: str, version: int,
                 shared: SharedWeights | None = None):
        import torch

        torch.set_num_threads(int(threads))  # the trainer's count: the same matmul kernels, the same bits
        self.policy = image.load(device)
        self.version, self.shared, self.job = int(version), shared, job
        job.start(self.policy)

    def ping(self) -> int:
        return os.getpid()

    def sample(self, payload: Any, version: int, weights: dict[str, Any] | None = None) -> tuple[Any, int, float]:
        """``(the job's reply, the weight version it ran with, seconds spent loading weights)``;
        ``weights``: the trainable tensors of ``version`` (None: read them from shared memory)."""
        load_s = 0.0
        if int(version) != self.version:
            t0 = time.perf_counter()
            source = weights if weights is not None else (self.shared.tensors if self.shared is not None else None)
            if source is None:
                raise RuntimeError(f"weights of version {version} were not sent to this generation worker")
            load_weights(self.policy, source)
            self.version = int(version)
            load_s = time.perf_counter() - t0
        return self.job.run(self.policy, payload), self.version, load_s

    def join_weights(self, address: Any, rank: int) -> int:
        """Become rank ``rank`` of the trainer's weight-broadcast group (runtime/weight_broadcast.py);
        returns once every member has joined."""
        check_layout(layout_of(trainable(self.policy)), address.layout)
        device = str(next(self.policy.parameters()).device) if address.backend == "nccl" else "cpu"
        self.receiver = Receiver(address, int(rank), device)
        return int(rank)

    def receive_weights(self, version: int) -> float:
        """Take part in the broadcast of ``version``'s weights; returns the seconds it took."""
        t0 = time.perf_counter()
        load_weights(self.policy, self.receiver.receive())
        self.version = int(version)
        return time.perf_counter() - t0

    def close(self) -> None:
        self.job.close()


def start_generation_processes(plan: Any) -> list[Any]:
    """The generation workers of a ``GenerationPlan`` as processes of this machine (executor=local)."""
    import math
    import torch.multiprocessing as tmp  # noqa: F401  (its reductions send shared tensors to the children)

    from rlinf_cli.runtime.procs import ChildProcess, hosted_main
    from rlinf_cli.runtime.workers import start_all

    ctx = tmp.get_context(plan.start_method)
    timeout = plan.timeout_s if plan.timeout_s is not None else math.inf
    environ = {**os.environ, "OMP_NUM_THREADS": str(plan.threads), "MKL_NUM_THREADS": str(plan.threads)}
    args = (GenerationWorker, plan.worker_args(), environ)
    return start_all(lambda i: ChildProcess(i, ctx, hosted_main, args, timeout, f"rlinf-generation-{i}"),
                     plan.num_workers)
