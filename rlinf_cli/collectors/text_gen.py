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
count: :func:`parts_are_exact` asks the policy itself, once per batch shape (MKL's default path gave
equal bits at the shapes tested; ``MKL_CBWR=COMPATIBLE`` computes the last rows of a block of 4 with
other kernels from 8 rows on, so its parts differ at most shapes). A part cannot see the batch's
later turns (which rows called a tool), nor when the first completion of a batch whose prompts all
have one length ends (transformers attends without a mask until then). With
``runtime.max_staleness=0`` (exact by promise) a batch that a part could not sample exactly is not
split: one worker samples all of it, in turn. With ``max_staleness >= 1`` it is split anyway (a
model without ``part=``: each part draws from a stream of its own; decorrelated, not the in-process
draws)."""

from __future__ import annotations

import hashlib
import inspect
import time
from dataclasses import dataclass
from typing import Any, Callable, Sequence

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


def parts_are_exact(policy: Any, prompts: int = 6, samples: int = 2,
                    runs: Sequence[tuple[int, int]] | None = None) -> bool:
    """Whether a batch of ``prompts`` prompts x ``samples`` completions, cut into ``runs`` of prompts (the
    rollout's split over two workers unless given), samples the whole batch's bits part by part on this
    machine. Asked at the batch's own shape and at four prompt widths: some kernels give a row other bits
    by the batch's row count and by the row's place in the last block of rows (``MKL_CBWR=COMPATIBLE``:
    blocks of 4 from 8 rows on), and a prefill's row count is prompts x width, so a probe at another
    shape said yes where the rollout's parts differed."""
    import torch

    if "part" not in inspect.signature(policy.generate).parameters or prompts < 2:
        return False
    runs = list(runs) if runs is not None else split(prompts, 2)
    base = policy.encode_prompts(PROBE)
    kw = dict(samples=samples, max_new_tokens=6, **({"values": True} if getattr(policy, "has_critic", False) else {}))
    for extra in range(4):
        ids = [list(base[i % len(base)]) for i in range(prompts)]
        longest = max(range(prompts), key=lambda i: len(ids[i]))
        ids[longest] += ids[longest][-1:] * extra
        if len({len(p) for p in ids}) == 1:  # split batches are padded ones (the rollout's rule)
            ids[0] = ids[0][1:]
        width = max(len(p) for p in ids)
        whole = policy.generate(ids, generator=torch.Generator(policy.device).manual_seed(extra), **kw)
        for lo, hi in runs:
            rows = list(range(samples * lo, samples * hi))
            part = policy.generate(ids[lo:hi], generator=torch.Generator(policy.device).manual_seed(extra),
                                   part=(rows, samples * prompts, width, True), **kw)
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

    def __init__(self, pool: GenerationPool, task: Any, tools: Toolbox, exact: bool,
                 parts_exact: bool | Callable[..., bool] = True):
        """``parts_exact``: whether parts sample the whole batch's bits, or the probe that says so for a
        batch shape (:func:`parts_are_exact`), asked once per shape."""
        self.pool, self.task, self.tools, self.exact = pool, task, tools, exact
        self._probe = parts_exact
        self._probed: dict[tuple[int, int, tuple[tuple[int, int], ...]], bool] = {}
        self.parts_exact = bool(parts_exact) if not callable(parts_exact) else True
        self._turn = 0  # which worker samples an unsplit batch next
        self.parts: list[int] = []  # how many workers each request waited for went to (since the last metrics)
        self.busy: list[tuple[float, float]] = []  # each such request's first start and last end in a worker

    def submit(self, policy: Any, samples: Sequence[TextSample], group_size: int, max_new_tokens: int,
               values: bool, generator: Any, version: int) -> Ticket:
        """Send one request with the weights of ``version`` (published first) from ``generator``'s state."""
        self.pool.publish(policy, version)
        base = dict(group_size=group_size, max_new_tokens=max_new_tokens, values=values, state=state_of(generator))
        part_ok = "part" in inspect.signature(policy.generate).parameters
        runs = self._runs(policy, samples, part_ok, group_size)
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

    def _runs(self, policy: Any, samples: Sequence[TextSample], part_ok: bool,
              group_size: int) -> list[tuple[int, int]]:
        """The prompts of each part: one run per worker, unless the request must be exact (max_staleness=0)
        and a part could not be (see the module's doc)."""
        whole = [(0, len(samples))]
        if self.pool.num_workers < 2 or len(samples) < 2:
            return whole
        runs = split(len(samples), self.pool.num_workers)
        if self.exact and (not part_ok or int(self.task.max_turns) > 1 or not self._width(policy, samples)[1]
                           or not self.exact_parts(policy, len(samples), group_size, runs)):
            return whole
        return runs

    def exact_parts(self, policy: Any, prompts: int, samples: int, runs: Sequence[tuple[int, int]]) -> bool:
        """Whether this batch shape's parts sample the whole batch's bits (probed once per shape, in the trainer)."""
        if not callable(self._probe):
            return bool(self._probe)
        key = (prompts, samples, tuple(runs))
        if key not in self._probed:
            self._probed[key] = bool(self._probe(policy, prompts, samples, list(runs)))
        return self._probed[key]

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
          exact: bool, shape: tuple[int, int] | None = None) -> TextGeneration:
    """Start the workers (each builds the policy and the task's tools once); ``shape``: the run's usual
    batch (prompts, completions each), whose parts are probed at once (``parts_exact``: the start says
    whether it splits; other shapes, such as refill rounds, are probed when first requested)."""
    import torch

    workers = int(placement.workers)
    pool = GenerationPool(executor, policy, TextSamplingJob(task), placement, runtime, version, torch.get_num_threads())
    gen = TextGeneration(pool, task, tools, exact, parts_are_exact)
    if exact and workers > 1 and shape is not None:
        gen.parts_exact = gen.exact_parts(policy, shape[0], shape[1], split(shape[0], workers))
    return gen
