"""Generation workers, the driver's side (``placement.generation.workers=N``): N copies of the
trainer's policy in other processes (``executor=local``) or Ray actors (``executor=ray``), each
running a job's requests (the text rollout's sampling) with weights of a known version.

- **Start**: the policy is written once (``gen_worker.PolicyImage``); the executor's optional
  ``start_generation_workers(plan)`` starts ``plan.num_workers`` :class:`~rlinf_cli.runtime.gen_worker.GenerationWorker`
  s where it places them and returns one ``WorkerHandle`` each (an executor without it is refused in one line).
- **Weights, versioned**: :meth:`GenerationPool.publish` makes version ``v`` (the updates done) the one
  requests name. On this machine (an executor with ``shared_memory``) the trainable tensors go to shared
  memory, which the driver writes only while no request is in flight; elsewhere the executor's
  ``publish_weights(tensors)`` makes one token (Ray: ``ray.put``) that each worker lacking ``v`` gets
  with its next request. Only tensors that train travel (with LoRA: the adapter, and a value head).
- **Faults**: a worker that dies is restarted (with the current weights) and its request sent again, up
  to ``runtime.max_restarts`` times per worker, each time one warning line; past that, one ``error:`` line.
  A request is a whole rollout, so ``runtime.worker_timeout_s`` does not apply: a worker is lost when its
  process or actor dies.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from rlinf_cli.errors import UserError
from rlinf_cli.runtime.gen_worker import GenerationJob, PolicyImage, SharedWeights, trainable
from rlinf_cli.runtime.weight_broadcast import GroupAddress, Sender, free_port, layout_of
from rlinf_cli.runtime.workers import RemoteError, WorkerDied, last_line, warn


# auto: shared memory where the executor's workers share this machine's memory, else its publish_weights
SYNC_MODES = ("auto", "shared_memory", "object_store", "broadcast")


def sync_mode(asked: str, shared_memory: bool, object_store: bool, executor: str) -> str:
    """The weight-sync mode ``placement.generation.sync=asked`` means on this executor, or one line."""
    if asked == "auto" and not shared_memory and not object_store:
        raise UserError(f"executor={executor} starts generation workers but has no object store to send them weights "
                        f"(publish_weights): use placement.generation.sync=broadcast, or executor=local or executor=ray")
    if asked == "auto":
        return "shared_memory" if shared_memory else "object_store"
    if asked == "shared_memory" and not shared_memory:
        raise UserError(f"placement.generation.sync=shared_memory needs workers on this machine (executor=local); "
                        f"executor={executor} places them elsewhere: use sync=auto or sync=broadcast")
    if asked == "object_store" and not object_store:
        raise UserError(f"placement.generation.sync=object_store needs an executor with an object store "
                        f"(publish_weights: executor=ray); executor={executor} has none: use sync=auto or sync=broadcast")
    return asked


class GenerationError(UserError):
    """A generation worker failed for good (its job raised, or it died too often): one line, exit 2."""


@dataclass(frozen=True)
class GenerationPlacement:
    """``placement.generation``: how many generation workers and what each reserves (Ray)."""

    workers: int = 0  # 0 = the trainer samples in its own process
    cpus: float = 1.0  # CPUs each worker reserves (executor=ray)
    gpus: float = 0.0  # GPUs each worker reserves (executor=ray); > 0: it samples on its GPU
    resources: dict[str, float] = field(default_factory=dict)  # custom Ray resources each worker reserves
    sync: str = "auto"  # how weights reach the workers: auto | shared_memory | object_store | broadcast

    def __post_init__(self) -> None:
        if self.workers < 0:
            raise ValueError(f"placement.generation.workers must be >= 0, got {self.workers}")
        if self.sync not in SYNC_MODES:
            raise ValueError(f"placement.generation.sync must be one of {', '.join(SYNC_MODES)}, got {self.sync!r}")
        if min(self.cpus, self.gpus, *self.resources.values()) < 0:
            raise ValueError("placement.generation reservations (cpus, gpus, resources) must be >= 0")


@dataclass(frozen=True)
class GenerationPlan:
    """What an executor's ``start_generation_workers`` starts: ``num_workers`` workers, each hosting
    ``GenerationWorker(*plan.worker_args())``."""

    image: PolicyImage  # a directory here (shared-memory executors) or packed files
    job: GenerationJob
    num_workers: int
    threads: int  # torch threads per worker: the trainer's
    device: str
    version: int  # the weights in the image
    placement: GenerationPlacement
    shared: SharedWeights | None = None  # the trainable tensors in shared memory (workers on this machine)
    start_method: str = "forkserver"  # local processes
    timeout_s: float | None = None  # None: wait while the worker lives (a request is a whole rollout)

    def worker_args(self) -> tuple:
        return (self.image, self.job, self.threads, self.device, self.version, self.shared)


@dataclass
class Pending:
    """Requests in flight: worker index -> (payload, ticket), sent with weight version ``version``."""

    sent: dict[int, tuple[Any, Any]]
    version: int


class GenerationPool:
    """The generation workers of one rollout, and the weight version each holds."""

    def __init__(self, executor: Any, policy: Any, job: GenerationJob, placement: GenerationPlacement,
                 runtime: Any, version: int, threads: int):
        name = getattr(executor, "name", type(executor).__name__)
        start = getattr(executor, "start_generation_workers", None)
        if start is None:
            raise UserError(f"executor={name} does not start generation workers: use executor=local or "
                            f"executor=ray, or placement.generation.workers=0 (sampling in the trainer)")
        local = bool(getattr(executor, "shared_memory", False))
        self.sync = sync_mode(placement.sync, local, hasattr(executor, "publish_weights"), name)
        self._publish = executor.publish_weights if self.sync == "object_store" else None
        self.image = PolicyImage.write(policy)
        self.shared = SharedWeights(policy) if self.sync == "shared_memory" else None
        device = str(policy.device) if local else ("cuda" if placement.gpus > 0 else "cpu")
        self.plan = GenerationPlan(self.image if local else self.image.packed(), job, placement.workers, int(threads),
                                   device, int(version), placement, self.shared, runtime.start_method)
        self.max_restarts = int(runtime.max_restarts)
        self.version = int(version)
        self._token: Any = None  # the published weights of `version` (sync=object_store)
        self._policy: Any = None  # sync=broadcast: whose weights the next broadcast sends
        self._layout = layout_of(trainable(policy)) if self.sync == "broadcast" else []
        self._host = str(getattr(executor, "driver_address", lambda: "127.0.0.1")())
        self._timeout_s = float(runtime.worker_timeout_s)
        self._device = str(policy.device)
        # NCCL takes one rank per GPU: only workers the executor places on GPUs of their own (Ray's
        # placement.generation.gpus) can use it; executor=local's share the trainer's device, so gloo
        self._backend = "nccl" if self._device.startswith("cuda") and placement.gpus > 0 and not local else "gloo"
        self.sender: Any = None
        self.restarts = [0] * placement.workers
        self.stats = {"restarts": 0.0, "sync_s": 0.0}
        try:
            self.handles = start(self.plan)
            self.known = [int(version)] * len(self.handles)  # the weight version each worker holds
            if self.sync == "broadcast":
                self._sync_group()
        except (RemoteError, WorkerDied, GenerationError) as exc:
            self.image.remove()
            if isinstance(exc, GenerationError):
                raise
            raise GenerationError(f"a generation worker failed to start: "
                                  f"{last_line(exc.args[0] if exc.args else '', type(exc).__name__)}") from exc
        where = {"shared_memory": "processes of this machine, weights through shared memory",
                 "object_store": "weights through the executor",
                 "broadcast": f"weights by {self._backend} broadcast"}[self.sync]
        self.label = f"{placement.workers} generation worker(s), executor={name} ({where}), {threads} torch thread(s) each"

    def _collective(self, method: str, args_of: Any, sender: Any,
                    trainer_side: Any) -> tuple[list[tuple[int, WorkerDied]], str | None]:
        """Ask every worker for its side of a collective, run the trainer's (``trainer_side(sender)``),
        and collect the replies: the workers lost (to restart) and, if any side failed, one line
        saying how."""
        tickets = [h.submit(method, *args_of(w)) for w, h in enumerate(self.handles)]
        failed = None
        try:
            trainer_side(sender)
        except RuntimeError as exc:  # gloo/NCCL/the store: a member was lost ("Connection closed by peer")
            failed = last_line(str(exc), type(exc).__name__)
        if failed is not None:
            sender.close()  # the live workers' sides fail now, not at the group's timeout
        dead: list[tuple[int, WorkerDied]] = []
        for w, (h, t) in enumerate(zip(self.handles, tickets)):
            try:
                h.result(t)
            except WorkerDied as exc:
                dead.append((w, exc))
            except RemoteError as exc:  # its side of a collective that failed elsewhere; the worker lives
                failed = failed or last_line(exc.args[0] if exc.args else "", "RemoteError")
        return dead, failed

    def _sync_group(self) -> None:
        """sync=broadcast: form the group if it is not formed (at the start, after a restart: a new
        process is not a member of the old one) and send the current version to the workers lacking
        it. A worker lost during either is restarted (within its budget) and both are done again; no
        request may be in flight. The trainer's weights are read now: publish's caller has not
        changed them since (the update that follows sends no request first)."""
        while True:
            dead: list[tuple[int, WorkerDied]] = []
            failed = None
            if self.sender is None:
                address = GroupAddress(self._host, free_port(self._host), len(self.handles) + 1, self._backend,
                                       self._timeout_s, self._layout)
                sender = Sender(address, self._device if self._backend == "nccl" else "cpu")
                dead, failed = self._collective("join_weights", lambda w: (address, w + 1), sender, Sender.open)
                self.sender = sender if not dead and failed is None else None
            if self.sender is not None:
                if self._policy is None or all(k == self.version for k in self.known):
                    return
                t0 = time.perf_counter()
                tensors = trainable(self._policy)
                dead, failed = self._collective("receive_weights", lambda w: (self.version,), self.sender,
                                                lambda sender: sender.send(tensors))
                self.stats["sync_s"] += time.perf_counter() - t0
                if not dead and failed is None:
                    self.known = [self.version] * len(self.handles)
                    return
                self.sender = None  # a collective that failed leaves the group unusable
            if not dead:
                raise GenerationError(f"the weight broadcast to the generation workers failed with every worker "
                                      f"alive: {failed}")
            for w, exc in dead:
                self._restart(w, exc)

    @property
    def num_workers(self) -> int:
        return len(self.handles)

    def publish(self, policy: Any, version: int) -> None:
        """Make ``version`` (the policy's weights now) the one the next requests name; call with no
        request in flight (shared memory is written in place)."""
        if int(version) == self.version:
            return
        t0 = time.perf_counter()
        if self.shared is not None:
            self.shared.write(policy)
        elif self.sync == "broadcast":  # sent when the workers are next idle (_sync_group)
            self._policy = policy
        else:
            self._token = self._publish({k: v.detach().to("cpu") for k, v in trainable(policy).items()})
        self.version = int(version)
        self.stats["sync_s"] += time.perf_counter() - t0

    def submit(self, payloads: dict[int, Any]) -> Pending:
        """Send ``payloads[w]`` to worker ``w`` with the current weights."""
        if self.sync == "broadcast":
            self._sync_group()
        return Pending({w: (p, self._send(w, p)) for w, p in payloads.items()}, self.version)

    def _send(self, w: int, payload: Any) -> Any:
        weights = self._token if self.known[w] != self.version and self.shared is None else None
        return self.handles[w].submit("sample", payload, self.version, weights)

    def wait(self, pending: Pending, policy: Any = None, version: int | None = None) -> dict[int, tuple[Any, int]]:
        """Worker -> (reply, weight version it sampled with). A worker lost meanwhile is restarted and
        its payload sent again, after the others have answered, with ``policy``'s weights (``version``)
        when given: the current ones."""
        replies: dict[int, tuple[Any, int]] = {}
        lost: list[tuple[int, WorkerDied]] = []
        for w, (_, ticket) in pending.sent.items():
            try:
                replies[w] = self._reply(w, ticket)
            except WorkerDied as exc:
                lost.append((w, exc))
        if lost and policy is not None and version is not None:
            self.publish(policy, version)  # every other worker has answered: nothing reads the weights now
        if self.sync == "broadcast":  # a group needs every member alive: restart all the lost first
            for w, exc in lost:
                self._restart(w, exc)
        for w, exc in lost:
            replies[w] = self._recover(w, pending.sent[w][0], exc, restarted=self.sync == "broadcast")
        return replies

    def _reply(self, w: int, ticket: Any) -> tuple[Any, int]:
        try:
            reply, version, load_s = self.handles[w].result(ticket)
        except RemoteError as exc:
            raise GenerationError(f"generation worker {w} failed: {last_line(exc.args[0] if exc.args else '', 'unknown error')}") from exc
        self.known[w] = int(version)
        self.stats["sync_s"] += float(load_s)
        return reply, int(version)

    def _recover(self, w: int, payload: Any, lost: WorkerDied, restarted: bool = False) -> tuple[Any, int]:
        """Restart worker ``w`` (within its budget, unless ``restarted`` already) and send ``payload``
        again, until it answers."""
        while True:
            if not restarted:
                self._restart(w, lost)
            restarted = False
            try:
                if self.sync == "broadcast":  # every other worker has answered: the group forms again
                    self._sync_group()
                return self._reply(w, self._send(w, payload))
            except WorkerDied as exc:
                lost = exc

    def _restart(self, w: int, lost: WorkerDied) -> None:
        """Worker ``w`` again, in a fresh process or actor holding the image's weights (one warning
        line), or one ``error:`` line past its budget."""
        if self.restarts[w] >= self.max_restarts:
            raise GenerationError(f"generation worker {w} died during sampling ({lost}); restarted {self.restarts[w]} "
                                  f"time(s) already (runtime.max_restarts={self.max_restarts}, per worker). Check its "
                                  f"memory (each worker holds a copy of the policy) or raise runtime.max_restarts")
        self.restarts[w] += 1
        self.stats["restarts"] += 1
        warn(f"generation worker {w} died during sampling ({lost}); restarting it ({self.restarts[w]}/"
             f"{self.max_restarts} for this worker) and sending its request again")
        try:
            self.handles[w].restart()
        except (RemoteError, WorkerDied) as exc:
            raise GenerationError(f"generation worker {w} died during sampling ({lost}) and could not be "
                                  f"restarted: {last_line(exc.args[0] if exc.args else '', type(exc).__name__)}") from exc
        self.known[w] = self.plan.version  # a fresh worker holds the image's weights
        self.sender = None  # ... and is no member of the broadcast group (sync=broadcast)

    def take_stats(self) -> dict[str, float]:
        """Restarts and weight-sync seconds since the last call."""
        out, self.stats = self.stats, {"restarts": 0.0, "sync_s": 0.0}
        return out

    def close(self, in_flight: bool = False) -> None:
        """Stop the workers; with a request ``in_flight`` that nobody will use, without waiting for it."""
        for h in getattr(self, "handles", []):
            try:
                h.kill() if in_flight and hasattr(h, "kill") else h.close()
            except Exception:  # closing must not mask the error that made us close
                pass
        self.image.remove()
