"""The text rollout's sampling in generation workers (``placement.generation.workers=N``).

A request (one draw of prompts, ``group_size`` completions each) is split into parts of whole
groups, one part per worker, each sampled there by :func:`~rlinf_cli.collectors.text_sampling.sample_completions`
(tool turns and scoring included: :class:`TextSamplingJob`), and merged back in the original order.
The sampler's RNG travels with the request: every part starts from the trainer's generator state,
and the trainer's generator continues from the state of the part that drew the most (the state the
whole batch would have reached), so a run's sampler stream is the in-process one.

**Exact parts.** A model whose ``generate`` takes ``part=`` (``model=hf``) samples a part's rows as
the whole batch would (rlinf_model_hf/sampling.py: the whole batch's noise, its prompt width, its
kernels), where this machine's matrix products give a row the same bits whatever the batch's row
count: :func:`parts_are_exact` asks the policy itself once (MKL's default path does from 4 rows on;
``MKL_CBWR=COMPATIBLE`` does not). A part cannot see the batch's later turns (which rows called a
tool), nor when the first completion of a batch whose prompts all have one length ends (transformers
attends without a mask until then). With ``runtime.max_staleness=0`` (exact by promise) a batch that
a part could not sample exactly is not split: one worker samples all of it, in turn. With
``max_staleness >= 1`` it is split anyway (a model without ``part=``: each part draws from a stream
of its own; decorrelated, not the in-process draws).
"""

from __future__ import annotations

import hashlib
import inspect
import time
from dataclasses import dataclass
from typing import Any, Sequence

from rlinf_cli.api import TextSample
from rlinf_cli.collectors.text_sampling import Completion, Part, prompt_ids, sample_completions
from rlinf_cli.collectors.text_tools import NO_TOOLS, Toolbox
from rlinf_cli.runtime.generation import GenerationPool, Pending


@dataclass
class SampleRequest:
    samples: list[TextSample]
    group_size: int
    max_new_tokens: int
    values: bool  # record the critic's values (PPO)
    state: bytes  # the sampler's RNG state at the start of the whole batch
    part: Part | None = None  # where these samples lie in the batch (None: all of it, or a stream of its own)
    stream: int | None = None  # an own stream: the state hashed with this number


@dataclass
class SampleReply:
    completions: list[Completion]
    state: bytes  # the sampler's state after this part
    steps: int  # sampling steps drawn (the longest completion of each turn, summed)
    began: float = 0.0  # wall clock (time.time()) when the worker started and ended this part: the
    ended: float = 0.0  # rollout measures how much sampling overlapped the trainer's update


def _generator(device: Any, state: bytes, stream: int | None = None) -> Any:
    """A generator on ``device`` at ``state``; with ``stream`` (or a state of another device's kind), seeded from it."""
    import torch

    gen = torch.Generator(device=device)
    raw = torch.frombuffer(bytearray(state), dtype=torch.uint8)
    if stream is None and raw.numel() == gen.get_state().numel():
        gen.set_state(raw)
    else:
        gen.manual_seed(int.from_bytes(hashlib.sha256(state + str(stream).encode()).digest()[:8], "little"))
    return gen


def state_of(gen: Any) -> bytes:
    return bytes(gen.get_state().cpu().numpy().tobytes())


class _Counting:
    """The policy, counting the sampling steps of its ``generate`` calls (a step draws once)."""

    def __init__(self, policy: Any):
        self.policy, self.steps = policy, 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.policy, name)

    def generate(self, *args: Any, **kwargs: Any) -> Any:
        gen = self.policy.generate(*args, **kwargs)
        self.steps += int(gen.lengths.max()) if len(gen.lengths) else 0
        return gen


class TextSamplingJob:
    """What each generation worker runs: its part of a request, with the task's tools built there."""

    def __init__(self, task: Any):
        self.task = task
        self.tools: Toolbox = NO_TOOLS

    def start(self, policy: Any) -> None:
        self.tools = Toolbox.for_task(self.task)

    def run(self, policy: Any, req: SampleRequest) -> SampleReply:
        began = time.time()
        gen = _generator(policy.device, req.state, req.stream)
        counted = _Counting(policy)
        comps = sample_completions(counted, self.task, req.samples, req.group_size, req.max_new_tokens,
                                   generator=gen, tools=self.tools, values=req.values, part=req.part)
        return SampleReply(comps, state_of(gen), counted.steps, began, time.time())

    def close(self) -> None:
        self.tools.close()


def split(n: int, parts: int) -> list[tuple[int, int]]:
    """``n`` prompts in ``parts`` contiguous runs as even as possible (earlier runs one longer)."""
    parts = max(1, min(parts, n))
    q, r = divmod(n, parts)
    out, lo = [], 0
    for i in range(parts):
        hi = lo + q + (1 if i < r else 0)
        out.append((lo, hi))
        lo = hi
    return out


@dataclass
class Ticket:
    pending: Pending
    order: list[int]  # the workers, in the order of their parts


PROBE = ["1+2=", "34+56=", "7=", "890+12=", "5+5=", "66+7="]  # prompts of several lengths


def parts_are_exact(policy: Any) -> bool:
    """Whether parts of a batch sampled with ``generate(..., part=)`` give the whole batch's bits on this
    machine: six prompts, two completions each, sampled whole and in parts of 1+5 and 3+3 prompts."""
    import torch

    if "part" not in inspect.signature(policy.generate).parameters:
        return False
    prompts = policy.encode_prompts(PROBE)
    lengths = [len(p) for p in prompts]
    shape = (max(lengths), min(lengths) < max(lengths))
    kw = dict(samples=2, max_new_tokens=6, **({"values": True} if getattr(policy, "has_critic", False) else {}))
    whole = policy.generate(prompts, generator=torch.Generator(policy.device).manual_seed(0), **kw)
    for lo, hi in ((0, 1), (1, 6), (0, 3), (3, 6)):
        rows = list(range(2 * lo, 2 * hi))
        part = policy.generate(prompts[lo:hi], generator=torch.Generator(policy.device).manual_seed(0),
                               part=(rows, 2 * len(prompts), *shape), **kw)
        T = part.tokens.shape[1]
        pairs = [(part.tokens, whole.tokens[rows, :T]), (part.logprobs, whole.logprobs[rows, :T]),
                 (part.lengths, whole.lengths[rows])]
        if part.values is not None:
            pairs.append((part.values, whole.values[rows, :T]))
        if not all(a.shape == b.shape and torch.equal(a, b) for a, b in pairs):
            return False
    return True


class TextGeneration:
    """The text rollout's side of its generation workers: requests split, replies merged, the sampler carried."""

    def __init__(self, pool: GenerationPool, task: Any, tools: Toolbox, exact: bool, parts_exact: bool = True):
        self.pool, self.task, self.tools, self.exact, self.parts_exact = pool, task, tools, exact, parts_exact
        self._turn = 0  # which worker samples an unsplit batch next
        self.parts: list[int] = []  # how many workers each request waited for went to (since the last metrics)
        self.busy: list[tuple[float, float]] = []  # each such request's first start and last end in a worker

    def submit(self, policy: Any, samples: Sequence[TextSample], group_size: int, max_new_tokens: int,
               values: bool, generator: Any, version: int) -> Ticket:
        """Send one request with the weights of ``version`` (published first) from ``generator``'s state."""
        self.pool.publish(policy, version)
        base = dict(group_size=group_size, max_new_tokens=max_new_tokens, values=values, state=state_of(generator))
        part_ok = "part" in inspect.signature(policy.generate).parameters
        runs = self._runs(policy, samples, part_ok)
        if len(runs) == 1:  # the whole batch, as in the trainer, on the next worker in turn
            w = self._turn % self.pool.num_workers
            self._turn += 1
            return Ticket(self.pool.submit({w: SampleRequest(list(samples), **base)}), [w])
        payloads: dict[int, SampleRequest] = {}
        width, padded = self._width(policy, samples) if part_ok else (0, False)
        for w, (lo, hi) in enumerate(runs):
            part = Part(lo * group_size, len(samples) * group_size, width, padded) if part_ok else None
            payloads[w] = SampleRequest(list(samples[lo:hi]), part=part, stream=None if part_ok else w, **base)
        return Ticket(self.pool.submit(payloads), list(payloads))

    def _runs(self, policy: Any, samples: Sequence[TextSample], part_ok: bool) -> list[tuple[int, int]]:
        """The prompts of each part: one run per worker, unless the request must be exact (max_staleness=0)
        and a part could not be (see the module's doc)."""
        whole = [(0, len(samples))]
        if self.pool.num_workers < 2 or len(samples) < 2:
            return whole
        if self.exact and (not part_ok or not self.parts_exact or int(self.task.max_turns) > 1
                           or not self._width(policy, samples)[1]):
            return whole
        return split(len(samples), self.pool.num_workers)

    def _width(self, policy: Any, samples: Sequence[TextSample]) -> tuple[int, bool]:
        """The batch's longest prompt in tokens, and whether some prompt is shorter."""
        lengths = [len(p) for p in prompt_ids(policy, [s.prompt for s in samples], self.tools.schemas)]
        return max(lengths), min(lengths) < max(lengths)

    def wait(self, ticket: Ticket, policy: Any, generator: Any, version: int) -> list[Completion]:
        """The completions in request order; ``generator`` continues where the whole batch's draws end."""
        replies = self.pool.wait(ticket.pending, policy, version)
        self.parts.append(len(ticket.order))
        spans = [replies[w][0] for w in ticket.order]
        self.busy.append((min(r.began for r in spans), max(r.ended for r in spans)))
        comps: list[Completion] = []
        best: SampleReply | None = None
        for w in ticket.order:
            reply, used = replies[w]
            for c in reply.completions:
                c.weight_version = used
            comps += reply.completions
            if best is None or reply.steps > best.steps:
                best = reply
        if best is not None:
            _set_state(generator, best.state)
        return comps


def _set_state(generator: Any, state: bytes) -> None:
    import torch

    raw = torch.frombuffer(bytearray(state), dtype=torch.uint8)
    if raw.numel() == generator.get_state().numel():
        generator.set_state(raw)
    else:  # the workers sample on another kind of device: carry on from a seed of their state
        generator.manual_seed(int.from_bytes(hashlib.sha256(state).digest()[:8], "little"))


def start(executor: Any, policy: Any, task: Any, tools: Toolbox, placement: Any, runtime: Any, version: int,
          exact: bool) -> TextGeneration:
    """Start the workers (each builds the policy and the task's tools once)."""
    import torch

    probe = exact and placement.workers > 1 and parts_are_exact(policy)  # before the workers share the cores
    pool = GenerationPool(executor, policy, TextSamplingJob(task), placement, runtime, version, torch.get_num_threads())
    return TextGeneration(pool, task, tools, exact, probe)
