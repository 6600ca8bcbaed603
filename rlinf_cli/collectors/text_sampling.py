"""Sampling a text task: a language model's completions of a task's prompts, scored by its reward,
and the Experience they make.

A text policy (``rlinf-model-hf``'s ``HFCausalLM`` or any model with the same methods) provides
``encode_prompts``, ``encode_text``, ``decode``, ``generate(prompt_ids, samples=G, ...)`` (tokens,
per-token log-probs, lengths, finish reasons) and ``evaluate(obs, actions)`` on the minibatches
built here (``obs = {prompt_ids, prompt_mask}`` one row per group, ``actions = {ids, attn}`` one
row per completion); for algorithms with a critic also ``generate(..., values=True)`` (the value
before each token) and per-token values from ``evaluate``. An episode is a prompt and its
completion, tool turns included (tool output is context: its tokens get loss mask 0). Experience
is laid out ``[T, N]`` like any other: "episodes" rollouts are one step of ``groups x group_size``
completions (groups side by side), "steps" rollouts ``rollout_steps x num_envs`` one-step episodes
of fresh prompts.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from typing import Any, NamedTuple, Sequence

import torch

from rlinf_cli import toolcalls
from rlinf_cli.api import Score, TextSample, TextTask
from rlinf_cli.collectors.text_tools import NO_TOOLS, Toolbox
from rlinf_cli.experience import Experience


@dataclass
class Completion:
    """One sampled episode of a text task."""

    sample: TextSample
    tokens: list[int]  # completion tokens: model turns and tool output, in order
    loss_mask: list[int]  # 1 where the policy wrote the token
    logprobs: list[float]  # log pi at sampling time (0 for tool tokens)
    values: list[float] | None = None  # the critic's value before each token at sampling time (0 for tool tokens)
    text: str = ""  # decoded completion (special tokens removed)
    score: Score | None = None
    turns: int = 1
    finish: str = "length"  # eos | stop | length
    prompt_ids: list[int] = field(default_factory=list)  # the prompt as the policy saw it (tools described)
    turn_start: int = 0  # where the last model turn begins in tokens
    tool_calls: int = 0  # calls the toolbox ran or refused
    tool_errors: list[str] = field(default_factory=list)  # the kind of each call that returned no result
    weight_version: int = 0  # the policy's version (updates done) it was sampled with


class Part(NamedTuple):
    """Where the samples of one generation worker's request lie in the rollout's batch (text_gen.py):
    its completions are rows ``first..`` of ``total``; the batch's longest prompt has ``width``
    tokens, and ``padded``: some prompt has fewer."""

    first: int
    total: int
    width: int
    padded: bool


@dataclass
class RolloutStats:
    seconds: float = 0.0
    generated_tokens: int = 0  # tokens written by the policy
    prompts_drawn: int = 0
    groups_dropped: int = 0
    groups_kept: int = 0
    seen: list[Completion] = field(default_factory=list)
    version: int = 0  # the trainer's weight version (updates done) when the rollout was collected
    overlap: tuple[float, float, float] = (0.0, 0.0, 0.0)  # generation workers: busy s, of which during the update, fraction


def prompt_ids(policy: Any, texts: Sequence[str], schemas: Sequence[Any] = ()) -> list[list[int]]:
    """The prompts' token ids; with tools (function schemas), described as the policy's chat template
    does, or in the fallback text (toolcalls.tools_prompt) for a policy whose prompts take no tools."""
    if not schemas:
        return policy.encode_prompts(list(texts))
    if "tools" in inspect.signature(policy.encode_prompts).parameters:
        return policy.encode_prompts(list(texts), tools=list(schemas))
    preamble = toolcalls.tools_prompt(schemas)
    return policy.encode_prompts([f"{preamble}\n\n{t}" for t in texts])


def sample_completions(policy: Any, task: TextTask, samples: Sequence[TextSample], group_size: int,
                       max_new_tokens: int, greedy: bool = False, generator: torch.Generator | None = None,
                       tools: Toolbox = NO_TOOLS, values: bool = False, part: Part | None = None) -> list[Completion]:
    """``group_size`` completions per sample (rows grouped by sample), tool turns included, scored.

    A turn ends at eos, a stop string (a tool call's closing tag among them) or ``max_new_tokens``.
    After a turn that calls a tool, the call's result is appended (context: loss mask 0, log-prob 0)
    and the model writes the next turn, up to ``task.max_turns`` turns and ``task.max_episode_tokens``.
    ``values``: record the critic's value before each token too (``Completion.values``).
    ``part``: these samples are a generation worker's part of a larger batch; the policy's
    ``generate(..., part=(rows, total, width, padded))`` samples their rows as the whole batch would
    (the first turn exactly; later turns draw their rows' noise of that batch, decorrelated).
    """
    prompts = prompt_ids(policy, [s.prompt for s in samples], tools.schemas)
    stop = tuple(task.stop) + ((toolcalls.CALL_CLOSE,) if tools else ())
    budget = getattr(task, "max_episode_tokens", None)
    out = [Completion(samples[i // group_size], [], [], [], [] if values else None,
                      prompt_ids=list(prompts[i // group_size])) for i in range(len(samples) * group_size)]
    critic = {"values": True} if values else {}  # only then: text policies without a critic need not know it
    row = {id(c): i for i, c in enumerate(out)}
    gen = policy.generate(prompts, samples=group_size, max_new_tokens=_cap(max_new_tokens, budget), greedy=greedy,
                          stop=stop, generator=generator, **critic, **_part_of(part, row, out, True))
    _append_turns(out, gen, budget)
    active: Sequence[Completion] = out  # the rows whose last model turn was just written
    for _turn in range(1, int(task.max_turns)):
        pending = _tool_turns(policy, task, tools, active, budget)
        if not pending:
            break
        left = max(int(budget) - len(c.tokens) for c in pending) if budget else max_new_tokens
        more = policy.generate([c.prompt_ids + c.tokens for c in pending], samples=1,
                               max_new_tokens=min(max_new_tokens, left), greedy=greedy, stop=stop, generator=generator,
                               **critic, **_part_of(part, row, pending, False))
        _append_turns(pending, more, budget)
        active = pending
    for c in out:
        c.text = policy.decode(c.tokens)
        c.score = task.score(c.sample, c.text)
    return out


def _part_of(part: Part | None, row: dict[int, int], rows: Sequence[Completion], first_turn: bool) -> dict[str, Any]:
    """``generate``'s ``part=`` for ``rows`` (none without a part). Later turns are batches of the rows
    that called a tool, across all workers in one process: a part draws its rows' noise of the whole
    batch (no two rows share it) but cannot pad like a batch it does not see."""
    if part is None:
        return {}
    rows_of = [part.first + row[id(c)] for c in rows]
    return {"part": (rows_of, part.total, part.width, part.padded) if first_turn else (rows_of, part.total, 0, False)}


def _cap(max_new_tokens: int, budget: int | None) -> int:
    return min(max_new_tokens, int(budget)) if budget else max_new_tokens


def _append_turns(rows: Sequence[Completion], gen: Any, budget: int | None) -> None:
    """Add one model turn per row from a ``Generation`` (cut where the episode's budget ends)."""
    for j, c in enumerate(rows):
        n = int(gen.lengths[j])
        finish = gen.finish[j]
        if budget and len(c.tokens) + n > int(budget):
            n, finish = max(0, int(budget) - len(c.tokens)), "length"
        c.turn_start = len(c.tokens)
        c.tokens += gen.tokens[j, :n].tolist()
        c.loss_mask += [1] * n
        c.logprobs += gen.logprobs[j, :n].tolist()
        if c.values is not None:
            c.values += gen.values[j, :n].tolist()
        c.finish = finish


def _tool_turns(policy: Any, task: TextTask, tools: Toolbox, rows: Sequence[Completion],
                budget: int | None) -> list[Completion]:
    """Append the result of each row's tool call (or the task's own ``tool_response``); return the
    rows that go on to another model turn."""
    calls: list[tuple[Completion, toolcalls.ToolCall]] = []
    replies: list[tuple[Completion, list[int]]] = []
    for c in rows:
        if budget and len(c.tokens) >= int(budget):
            continue
        call = toolcalls.parse_call(policy.decode(c.tokens[c.turn_start:])) if tools else None
        if call is not None:
            calls.append((c, call))
        elif c.finish != "eos":
            reply = task.tool_response(c.sample, policy.decode(c.tokens))
            if reply is not None:
                replies.append((c, policy.encode_text(reply)))
    for (c, call), result in zip(calls, tools.run([call for _, call in calls]) if calls else []):
        c.tool_calls += 1
        if not result.ok:
            c.tool_errors.append(str(result.error))
        replies.append((c, result_tokens(policy, call.name, result.text, c.finish == "eos")))
    pending = []
    for c, ids in replies:
        if budget:
            ids = ids[: max(0, int(budget) - len(c.tokens))]
        c.tokens += ids
        c.loss_mask += [0] * len(ids)
        c.logprobs += [0.0] * len(ids)
        if c.values is not None:
            c.values += [0.0] * len(ids)
        if budget and len(c.tokens) >= int(budget):
            c.finish = "length"
        else:
            c.turns += 1  # the model writes another turn
            pending.append(c)
    return pending


def result_tokens(policy: Any, name: str, text: str, after_eos: bool) -> list[int]:
    """The tokens of a tool's result as the policy renders it (its chat template's tool message),
    or the fallback text ``<tool_response>...</tool_response>`` for a policy without that method."""
    render = getattr(policy, "encode_tool_result", None)
    if render is not None:
        return list(render(name, text, after_eos=after_eos))
    return policy.encode_text(toolcalls.result_text(text))


def episode_metrics(completions: Sequence[Completion], with_tools: bool, prefix: str = "rollout/") -> dict[str, float]:
    """Turns per episode and, with tools, the calls: how many, the share that returned a result
    (well-formed calls of a known tool with fitting arguments that answered without an error), and
    the failures by kind (only kinds that occurred)."""
    n = max(len(completions), 1)
    out = {f"{prefix}turns_mean": sum(c.turns for c in completions) / n}
    if not with_tools:
        return out
    calls = sum(c.tool_calls for c in completions)
    errors = [e for c in completions for e in c.tool_errors]
    out[f"{prefix}tool_calls_mean"] = calls / n
    out[f"{prefix}tool_errors"] = float(len(errors))
    if calls:  # no rate without calls (0 would read as "every call failed")
        out[f"{prefix}tool_call_success"] = (calls - len(errors)) / calls
    for kind in sorted(set(errors)):
        out[f"{prefix}tool_errors/{kind}"] = float(errors.count(kind))
    return out


def accuracy(completions: Sequence[Completion]) -> float:
    return sum(bool(c.score and c.score.correct) for c in completions) / max(len(completions), 1)


def pad_rows(rows: Sequence[Sequence[float]], value: float = 0, dtype: torch.dtype = torch.long, left: bool = False,
             width: int = 0) -> torch.Tensor:
    """Rows of different lengths as one tensor, padded with ``value`` on the right (or the left) to the
    longest row (at least ``width``)."""
    width = max(width, *(len(r) for r in rows))
    out = torch.full((len(rows), width), value, dtype=dtype)
    for i, r in enumerate(rows):
        start = width - len(r) if left else 0
        out[i, start:start + len(r)] = torch.tensor(r, dtype=dtype)
    return out


def to_experience(policy: Any, completions: Sequence[Completion], group_size: int, shape: tuple[int, int]) -> Experience:
    """Completions (groups contiguous) -> an Experience on the policy's device, laid out ``shape``."""
    dev, pad = policy.device, policy.pad_token_id
    firsts = [completions[g * group_size] for g in range(len(completions) // group_size)]
    # the prompts as sampling saw them (tools described), not encoded again
    prompts = [c.prompt_ids or policy.encode_prompts([c.sample.prompt])[0] for c in firsts]
    prompt_ids, prompt_mask = pad_rows(prompts, pad, left=True), pad_rows([[1] * len(p) for p in prompts], left=True)
    ids = pad_rows([c.tokens for c in completions], pad, width=1)
    attn = pad_rows([[1] * len(c.tokens) for c in completions], width=1)
    loss_mask = pad_rows([c.loss_mask for c in completions], dtype=torch.float32, width=1)
    old = pad_rows([c.logprobs for c in completions], dtype=torch.float32, width=1)
    B, L = ids.shape
    rewards = torch.tensor([c.score.reward if c.score else 0.0 for c in completions], dtype=torch.float32).to(dev)
    T, N = shape
    ones, zeros = torch.ones(T, N, device=dev), torch.zeros(T, N, device=dev)
    # with a critic, a value per token (the episode's reward comes at its last policy token: the
    # algorithm's GAE runs over the policy's tokens); without, one zero per episode
    per_token = all(c.values is not None for c in completions)
    values = pad_rows([c.values for c in completions], dtype=torch.float32, width=1).to(dev).reshape(T, N, L) \
        if per_token else zeros
    return Experience(obs={"prompt_ids": prompt_ids.to(dev), "prompt_mask": prompt_mask.to(dev)},
                      actions={"ids": ids.to(dev), "attn": attn.to(dev)}, logprobs=old.to(dev).reshape(T, N, L),
                      values=values, rewards=rewards.reshape(T, N), dones=ones, trunc_values=zeros, mask=ones,
                      last_value=torch.zeros(N, device=dev), episode_returns=rewards, group_size=group_size,
                      token_mask=loss_mask.to(dev).reshape(T, N, L), env_steps=B)
