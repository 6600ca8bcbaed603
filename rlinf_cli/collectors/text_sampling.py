"""Sampling a text task: a language model's completions of a task's prompts, scored by its reward,
and the Experience they make.

A text policy (``rlinf-model-hf``'s ``HFCausalLM`` or any model with the same methods) provides
``encode_prompts``, ``encode_text``, ``decode``, ``generate(prompt_ids, samples=G, ...)`` (tokens,
per-token log-probs, lengths, finish reasons) and ``evaluate(obs, actions)`` on the minibatches
built here (``obs = {prompt_ids, prompt_mask}`` one row per group, ``actions = {ids, attn}`` one
row per completion). An episode is a prompt and its completion, tool turns included (tool output
is context: its tokens get loss mask 0). Experience is laid out ``[T, N]`` like any other:
"episodes" rollouts are one step of ``groups x group_size`` completions (groups side by side),
"steps" rollouts ``rollout_steps x num_envs`` one-step episodes of fresh prompts.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

import torch

from rlinf_cli.api import Score, TextSample, TextTask
from rlinf_cli.experience import Experience


@dataclass
class Completion:
    """One sampled episode of a text task."""

    sample: TextSample
    tokens: list[int]  # completion tokens: model turns and tool output, in order
    loss_mask: list[int]  # 1 where the policy wrote the token
    logprobs: list[float]  # log pi at sampling time (0 for tool tokens)
    text: str = ""  # decoded completion (special tokens removed)
    score: Score | None = None
    turns: int = 1
    finish: str = "length"  # eos | stop | length


@dataclass
class RolloutStats:
    seconds: float = 0.0
    generated_tokens: int = 0  # tokens written by the policy
    prompts_drawn: int = 0
    groups_dropped: int = 0
    groups_kept: int = 0
    seen: list[Completion] = field(default_factory=list)


def sample_completions(policy: Any, task: TextTask, samples: Sequence[TextSample], group_size: int,
                       max_new_tokens: int, greedy: bool = False, generator: torch.Generator | None = None
                       ) -> list[Completion]:
    """``group_size`` completions per sample (rows grouped by sample), tool turns included, scored."""
    prompt_ids = policy.encode_prompts([s.prompt for s in samples])
    gen = policy.generate(prompt_ids, samples=group_size, max_new_tokens=max_new_tokens, greedy=greedy,
                          stop=tuple(task.stop), generator=generator)
    out: list[Completion] = []
    for i in range(len(samples) * group_size):
        n = int(gen.lengths[i])
        out.append(Completion(samples[i // group_size], gen.tokens[i, :n].tolist(), [1] * n,
                              gen.logprobs[i, :n].tolist(), finish=gen.finish[i]))
    for _turn in range(1, int(task.max_turns)):
        pending = []
        for c in out:
            if c.finish == "eos":
                continue
            reply = task.tool_response(c.sample, policy.decode(c.tokens))
            if reply is not None:
                tool = policy.encode_text(reply)
                c.tokens += tool
                c.loss_mask += [0] * len(tool)
                c.logprobs += [0.0] * len(tool)
                c.turns += 1
                pending.append(c)
        if not pending:
            break
        base = {id(s): ids for s, ids in zip(samples, prompt_ids)}
        more = policy.generate([base[id(c.sample)] + c.tokens for c in pending], samples=1,
                               max_new_tokens=max_new_tokens, greedy=greedy, stop=tuple(task.stop), generator=generator)
        for j, c in enumerate(pending):
            n = int(more.lengths[j])
            c.tokens += more.tokens[j, :n].tolist()
            c.loss_mask += [1] * n
            c.logprobs += more.logprobs[j, :n].tolist()
            c.finish = more.finish[j]
    for c in out:
        c.text = policy.decode(c.tokens)
        c.score = task.score(c.sample, c.text)
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
    samples = [completions[g * group_size].sample for g in range(len(completions) // group_size)]
    prompts = policy.encode_prompts([s.prompt for s in samples])
    prompt_ids, prompt_mask = pad_rows(prompts, pad, left=True), pad_rows([[1] * len(p) for p in prompts], left=True)
    ids = pad_rows([c.tokens for c in completions], pad, width=1)
    attn = pad_rows([[1] * len(c.tokens) for c in completions], width=1)
    loss_mask = pad_rows([c.loss_mask for c in completions], dtype=torch.float32, width=1)
    old = pad_rows([c.logprobs for c in completions], dtype=torch.float32, width=1)
    B, L = ids.shape
    rewards = torch.tensor([c.score.reward if c.score else 0.0 for c in completions], dtype=torch.float32).to(dev)
    T, N = shape
    ones, zeros = torch.ones(T, N, device=dev), torch.zeros(T, N, device=dev)
    return Experience(obs={"prompt_ids": prompt_ids.to(dev), "prompt_mask": prompt_mask.to(dev)},
                      actions={"ids": ids.to(dev), "attn": attn.to(dev)}, logprobs=old.to(dev).reshape(T, N, L),
                      values=zeros, rewards=rewards.reshape(T, N), dones=ones, trunc_values=zeros, mask=ones,
                      last_value=torch.zeros(N, device=dev), episode_returns=rewards, group_size=group_size,
                      token_mask=loss_mask.to(dev).reshape(T, N, L), env_steps=B)
