"""Batched sampling with a KV cache, and per-token log-probabilities for training.

Both functions share one trick: the G completions of a prompt share its prefix, so the prompt
goes through the network once and its KV cache is repeated G times. In training the repeated
cache keeps its autograd graph, so gradients through the prompt's keys and values are exact
(they sum over the group), at a fraction of the compute of G padded full sequences.

Log-probabilities are those of the tempered distribution ``softmax(logits / temperature)``, in
sampling and in training alike, so the ratio of new to old policy starts at exactly 1. With a
``value_head`` (the critic, critic.py) both also give the value of the state before each token, read
from the last hidden state at the position whose logits give that token's log-prob.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any, Sequence

import torch

_CACHE_KW: dict[type, str] = {}


def cache_kw(lm: Any) -> str:
    """transformers 5 calls the KV-cache argument ``cache``; 4.x calls it ``past_key_values``."""
    cls = type(lm)
    if cls not in _CACHE_KW:
        params = inspect.signature(lm.forward).parameters
        _CACHE_KW[cls] = "cache" if "cache" in params else "past_key_values"
    return _CACHE_KW[cls]


def out_cache(out: Any) -> Any:
    return out.get("cache") if out.get("cache") is not None else out.get("past_key_values")


def left_pad(prompts: Sequence[Sequence[int]], pad_id: int, device: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """Token lists -> (ids [P, L], mask [P, L]) padded on the left, so every prompt ends at column L-1."""
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for i, p in enumerate(prompts):
        if p:
            ids[i, width - len(p):] = torch.as_tensor(list(p), dtype=torch.long)
            mask[i, width - len(p):] = 1
    return ids.to(device), mask.to(device)


def positions(mask: torch.Tensor) -> torch.Tensor:
    return (mask.cumsum(1) - 1).clamp_min(0)


@dataclass
class Generation:
    """Sampled completions, ``samples`` consecutive rows per prompt."""

    tokens: torch.Tensor  # [B, T] long, pad after the end
    logprobs: torch.Tensor  # [B, T] log pi(token) under the tempered distribution; 0 after the end
    lengths: torch.Tensor  # [B] tokens written, the eos (or stop string's last token) included
    finish: list[str]  # per row: "eos", "stop" or "length"
    values: torch.Tensor | None = None  # [B, T] V(state before the token) with a value head; 0 after the end


def _sample(logits: torch.Tensor, temperature: float, top_p: float, greedy: bool,
            generator: torch.Generator | None) -> tuple[torch.Tensor, torch.Tensor]:
    logp = torch.log_softmax(logits.float() / max(temperature, 1e-6), dim=-1)
    if greedy:
        tok = logp.argmax(dim=-1)
    else:
        probs = logp.exp()
        if top_p < 1.0:  # nucleus: keep the smallest set of tokens whose mass reaches top_p
            sorted_p, order = probs.sort(dim=-1, descending=True)
            drop = sorted_p.cumsum(-1) - sorted_p > top_p
            sorted_p = sorted_p.masked_fill(drop, 0.0)
            probs = torch.zeros_like(probs).scatter_(-1, order, sorted_p)
        tok = torch.multinomial(probs, 1, generator=generator).squeeze(-1)
    return tok, logp.gather(-1, tok.unsqueeze(-1)).squeeze(-1)


@torch.no_grad()  # not inference_mode: the tokens feed the autograd graph of training later
def generate(
    lm: Any,
    prompts: Sequence[Sequence[int]],
    *,
    samples: int,
    max_new_tokens: int,
    eos_id: int,
    pad_id: int,
    temperature: float = 1.0,
    top_p: float = 1.0,
    greedy: bool = False,
    stop_check: Any = None,
    generator: torch.Generator | None = None,
    value_head: Any = None,
) -> Generation:
    """``samples`` completions per prompt, one batched decode loop with a KV cache.

    ``stop_check(row_tokens) -> bool`` ends a row early (a tool call's closing tag).
    ``value_head(hidden [B, H]) -> [B]``: also record the value before each token (``values``).
    """
    device = next(lm.parameters()).device
    ids, mask = left_pad(prompts, pad_id, device)
    kw = cache_kw(lm)
    hidden = {"output_hidden_states": True} if value_head is not None else {}
    out = lm(input_ids=ids, attention_mask=mask, position_ids=positions(mask), use_cache=True, logits_to_keep=1,
             **hidden)
    cache, logits = out_cache(out), out.logits[:, -1]
    value = value_head(out.hidden_states[-1][:, -1]) if value_head is not None else None
    if samples > 1:
        cache.batch_repeat_interleave(samples)
        logits = logits.repeat_interleave(samples, dim=0)
        mask = mask.repeat_interleave(samples, dim=0)
        value = value.repeat_interleave(samples, dim=0) if value is not None else None
    B = logits.shape[0]
    tokens = torch.full((B, max_new_tokens), pad_id, dtype=torch.long, device=device)
    logprobs = torch.zeros((B, max_new_tokens), device=device)
    values = torch.zeros((B, max_new_tokens), device=device) if value is not None else None
    done = torch.zeros(B, dtype=torch.bool, device=device)
    lengths = torch.zeros(B, dtype=torch.long, device=device)
    finish = ["length"] * B
    pos = mask.sum(1, keepdim=True)
    attn = torch.cat([mask, torch.zeros((B, max_new_tokens), dtype=mask.dtype, device=device)], dim=1)
    width = mask.shape[1]
    for t in range(max_new_tokens):
        tok, lp = _sample(logits, temperature, top_p, greedy, generator)
        live = ~done
        tok = torch.where(live, tok, torch.full_like(tok, pad_id))
        tokens[:, t] = tok
        logprobs[:, t] = torch.where(live, lp, torch.zeros_like(lp))
        if values is not None:
            values[:, t] = torch.where(live, value, torch.zeros_like(value))
        lengths += live.long()
        attn[:, width + t] = live.long()
        ended = live & (tok == eos_id)
        for i in torch.nonzero(ended).flatten().tolist():
            finish[i] = "eos"
        done |= ended
        if stop_check is not None:
            for i in torch.nonzero(~done).flatten().tolist():
                if stop_check(tokens[i, : t + 1].tolist()):
                    finish[i] = "stop"
                    done[i] = True
        if bool(done.all()) or t == max_new_tokens - 1:
            break
        out = lm(input_ids=tok.unsqueeze(1), attention_mask=attn[:, : width + t + 1], position_ids=pos + t,
                 use_cache=True, **{kw: cache}, **hidden)
        cache, logits = out_cache(out), out.logits[:, -1]
        if values is not None:
            value = value_head(out.hidden_states[-1][:, -1])
    T = int(lengths.max().item()) if B else 0
    return Generation(tokens[:, :T], logprobs[:, :T], lengths, finish,
                      values[:, :T] if values is not None else None)


def token_logprobs(
    lm: Any,
    prompt_ids: torch.Tensor,
    prompt_mask: torch.Tensor,
    completion_ids: torch.Tensor,
    completion_mask: torch.Tensor,
    group_size: int,
    temperature: float = 1.0,
    with_entropy: bool = True,
    value_head: Any = None,
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """Log pi of each completion token (and the entropy there, and with ``value_head`` the value of
    the state before it), differentiable.

    ``prompt_ids``/``prompt_mask`` [P, Lp] left-padded; ``completion_ids``/``completion_mask``
    [P * group_size, Lc] right-padded, group after group (mask = 1 for every real token, tool
    output included). Returns ``(logprobs, entropy, values)``, each [P * group_size, Lc] (None
    where not asked for).
    """
    kw = cache_kw(lm)
    hidden = {"output_hidden_states": True} if value_head is not None else {}
    out = lm(input_ids=prompt_ids, attention_mask=prompt_mask, position_ids=positions(prompt_mask), use_cache=True,
             logits_to_keep=1, **hidden)
    cache, first = out_cache(out), out.logits[:, -1:]
    h_first = out.hidden_states[-1][:, -1:] if hidden else None
    if group_size > 1:
        cache.batch_repeat_interleave(group_size)
        first = first.repeat_interleave(group_size, dim=0)
        h_first = h_first.repeat_interleave(group_size, dim=0) if hidden else None
        prompt_mask = prompt_mask.repeat_interleave(group_size, dim=0)
    attn = torch.cat([prompt_mask, completion_mask.to(prompt_mask.dtype)], dim=1)
    pos = prompt_mask.sum(1, keepdim=True) + torch.arange(completion_ids.shape[1], device=completion_ids.device)
    h = h_first
    if completion_ids.shape[1] > 1:
        out = lm(input_ids=completion_ids[:, :-1], attention_mask=attn[:, :-1], position_ids=pos[:, :-1],
                 use_cache=True, **{kw: cache}, **hidden)
        logits = torch.cat([first, out.logits], dim=1)
        h = torch.cat([h_first, out.hidden_states[-1]], dim=1) if hidden else None
    else:
        logits = first
    logp_all = torch.log_softmax(logits.float() / max(temperature, 1e-6), dim=-1)
    logp = logp_all.gather(-1, completion_ids.unsqueeze(-1)).squeeze(-1)
    entropy = -(logp_all.exp() * logp_all).sum(-1) if with_entropy else None
    return logp, entropy, value_head(h) if hidden else None
