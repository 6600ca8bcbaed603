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


def left_pad(prompts: Sequence[Sequence[int]], pad_id: int, device: Any, width: int = 0
             ) -> tuple[torch.Tensor, torch.Tensor]:
    """Token lists -> (ids [P, L], mask [P, L]) padded on the left, so every prompt ends at column L-1
    (L: the longest prompt, or ``width`` if that is more)."""
    width = max(width, *(len(p) for p in prompts))
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


# From this many rows on, this machine's matrix products of more than one output column gave every row
# the same bits whatever the batch's row count (measured on the CPUs tried: below 4 rows MKL's sgemm takes
# other kernels, with other sums). A one-column product (the value head) depends on the row count and
# each row's place throughout: a part computes it in place (_in_place).
BATCH_INVARIANT_ROWS = 4


def draw(probs: torch.Tensor, generator: torch.Generator | None,
         noise: tuple[torch.Tensor, int] | None = None) -> torch.Tensor:
    """One token per row from ``probs`` (rows need not sum to 1) by the inverse CDF: one uniform per
    row, found in the row's running sum (float64). A vocabulary-sized draw per row (torch.multinomial:
    argmax p / q, q ~ Exp(1)) cost 50 ms a step for 32 rows of SmolLM2's 49,152 tokens on one thread,
    more than a tenth of the decode step; this costs ~2 ms. ``noise=(rows, total)``: these are rows of
    a batch of ``total`` rows (a part): the whole batch's uniforms are drawn and these rows' used, so
    a part samples its rows as the batch does and leaves ``generator`` where the batch does."""
    total = probs.shape[0] if noise is None else int(noise[1])
    u = torch.rand(total, generator=generator, device=probs.device, dtype=torch.float64)
    if noise is not None:
        u = u[noise[0]]
    cdf = probs.double().cumsum(-1)
    # right=True: the first token whose running sum passes u; a zero-probability token never is
    tok = torch.searchsorted(cdf, (u * cdf[:, -1]).unsqueeze(-1), right=True).squeeze(-1)
    return tok.clamp_(max=probs.shape[-1] - 1)


def _sample(logits: torch.Tensor, temperature: float, top_p: float, greedy: bool,
            generator: torch.Generator | None, noise: tuple[torch.Tensor, int] | None = None
            ) -> tuple[torch.Tensor, torch.Tensor]:
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
        tok = draw(probs, generator, noise)
    return tok, logp.gather(-1, tok.unsqueeze(-1)).squeeze(-1)


def _in_place(value_head: Any, rows: torch.Tensor, total: int, samples: int) -> Any:
    """``value_head`` for a part: the head is one matrix-vector product, whose sums depend on the row
    count and each row's place (blocks of rows, measured), so the part's real rows are read at their
    places in a batch of the whole batch's size (zeros elsewhere; rows do not mix)."""
    prompts_of = rows[::samples] // samples

    def head(hidden: torch.Tensor, prefill: bool = False) -> torch.Tensor:
        where, size = (prompts_of, total // samples) if prefill else (rows, total)
        full = hidden.new_zeros((size, hidden.shape[-1]))
        full[where] = hidden[: len(where)]
        out = value_head(full)[where]
        return torch.cat([out, out[:1].expand(hidden.shape[0] - len(where))]) if hidden.shape[0] > len(where) else out

    return head


def pad_part(prompts: Sequence[Sequence[int]], samples: int, part: tuple[Sequence[int], int, int, bool]
             ) -> tuple[list[Sequence[int]], list[int]]:
    """``prompts`` of a part of a batch (``part=(rows, total, width, padded)``: generate) with the rows
    that make its kernels the whole batch's, and the noise row of every row.

    - Below :data:`BATCH_INVARIANT_ROWS` rows a matmul's sums depend on the row count: a small part
      computes copies of its first prompt (drawing that prompt's noise: they sample what it samples)
      until it has as many prompts and rows as the whole batch, or that many.
    - transformers' attention skips its mask while no position of the batch is masked, and masks
      every step once one is (a padded prompt, a finished row): when the whole batch is ``padded``
      (a prompt shorter than ``width``), a part whose prompts all have that width computes one more
      copy of its first prompt a token shorter, so that it masks from the first step as the batch does.
    """
    rows, total, width, padded = [int(r) for r in part[0]], int(part[1]), int(part[2]), bool(part[3])
    if len(rows) != len(prompts) * samples or not prompts or max(rows) >= total:
        raise ValueError(f"part=(rows, total, width, padded): one row index below total={total} per completion "
                         f"({len(prompts)} prompts x {samples}), got {len(rows)}")
    if len(rows) == total:  # the whole batch
        return list(prompts), rows
    floor = BATCH_INVARIANT_ROWS
    extra = max(len(prompts), min(total // samples, floor), -(-min(total, floor) // samples)) - len(prompts)
    shorter = padded and all(len(p) >= width for p in prompts)
    copies = [prompts[0]] * max(extra, int(shorter))
    if shorter:
        copies[0] = prompts[0][1:]
    return list(prompts) + copies, rows + rows[:samples] * len(copies)


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
    part: tuple[Sequence[int], int, int, bool] | None = None,
) -> Generation:
    """``samples`` completions per prompt, one batched decode loop with a KV cache.

    ``stop_check(row_tokens) -> bool`` ends a row early (a tool call's closing tag).
    ``value_head(hidden [B, H]) -> [B]``: also record the value before each token (``values``).
    ``part=(rows, total, width, padded)``: these completions are rows ``rows`` (one index each) of a
    batch of ``total`` rows split over processes, whose longest prompt has ``width`` tokens (``padded``:
    some prompt has fewer). Each step draws the whole batch's noise from ``generator`` and uses these
    rows'; the prompts are padded to ``width`` (attention sums over every key position, masked ones
    included, in an order set by the length) and the part computes what keeps its kernels the batch's
    (:func:`pad_part`); so it samples what the whole batch would for its rows, and leaves ``generator``
    where the whole batch would after as many steps as the part's longest completion.
    """
    device = next(lm.parameters()).device
    real = len(prompts) * samples  # rows returned (a part computes padding rows after them)
    noise, width = None, 0
    if part is not None:
        prompts, rows = pad_part(prompts, samples, part)
        noise, width = (torch.tensor(rows, dtype=torch.long, device=device), int(part[1])), int(part[2])
        if value_head is not None:
            value_head = _in_place(value_head, noise[0][:real], int(part[1]), samples)
    ids, mask = left_pad(prompts, pad_id, device, width)
    kw = cache_kw(lm)
    hidden = {"output_hidden_states": True} if value_head is not None else {}
    out = lm(input_ids=ids, attention_mask=mask, position_ids=positions(mask), use_cache=True, logits_to_keep=1,
             **hidden)
    cache, logits = out_cache(out), out.logits[:, -1]
    value = None
    if value_head is not None:  # a part's head reads the prompts at their places among the batch's prompts
        value = value_head(out.hidden_states[-1][:, -1], **({"prefill": True} if part is not None else {}))
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
        tok, lp = _sample(logits, temperature, top_p, greedy, generator, noise)
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
            for i in torch.nonzero(~done[:real]).flatten().tolist():
                if stop_check(tokens[i, : t + 1].tolist()):
                    finish[i] = "stop"
                    done[i] = True
        if bool(done[:real].all()) or t == max_new_tokens - 1:  # padding rows of a part never hold it up
            break
        out = lm(input_ids=tok.unsqueeze(1), attention_mask=attn[:, : width + t + 1], position_ids=pos + t,
                 use_cache=True, **{kw: cache}, **hidden)
        cache, logits = out_cache(out), out.logits[:, -1]
        if values is not None:
            value = value_head(out.hidden_states[-1][:, -1])
    T = int(lengths[:real].max().item()) if real else 0
    return Generation(tokens[:real, :T], logprobs[:real, :T], lengths[:real], finish[:real],
                      values[:real, :T] if values is not None else None)


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
    hidden = {"output_hidden_states": True} if value_head is not None else {}
    if lm.training and _checkpointing(lm):
        return _full_sequences(lm, prompt_ids, prompt_mask, completion_ids, completion_mask, group_size, temperature,
                               with_entropy, value_head)
    kw = cache_kw(lm)
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
    return _scores(logits, completion_ids, temperature, with_entropy, value_head, h)


def _scores(logits: torch.Tensor, completion_ids: torch.Tensor, temperature: float, with_entropy: bool,
            value_head: Any, h: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    logp_all = torch.log_softmax(logits.float() / max(temperature, 1e-6), dim=-1)
    logp = logp_all.gather(-1, completion_ids.unsqueeze(-1)).squeeze(-1)
    entropy = -(logp_all.exp() * logp_all).sum(-1) if with_entropy else None
    return logp, entropy, value_head(h) if value_head is not None else None


def _checkpointing(lm: Any) -> bool:
    """Whether ``lm`` recomputes activations in backward (transformers then drops ``use_cache``)."""
    for name in ("is_activation_checkpointing", "is_gradient_checkpointing"):  # the newer name first
        base = getattr(lm, "get_base_model", lambda: lm)()
        if name in dir(type(base)):
            return bool(getattr(base, name))
    return False


def _full_sequences(lm: Any, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, completion_ids: torch.Tensor,
                    completion_mask: torch.Tensor, group_size: int, temperature: float, with_entropy: bool,
                    value_head: Any) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """:func:`token_logprobs` without the prompt's cache, for a model training with gradient
    checkpointing (transformers turns ``use_cache`` off there, so there is no cache to repeat): each
    completion after its own copy of the prompt, one forward. Same positions and masks as the cached
    path, so the same numbers up to floating-point order; the price is the prompt computed
    ``group_size`` times, what checkpointing trades for memory anyway."""
    Lp = prompt_ids.shape[1]
    pm = prompt_mask.repeat_interleave(group_size, dim=0)
    ids = torch.cat([prompt_ids.repeat_interleave(group_size, dim=0), completion_ids], dim=1)
    attn = torch.cat([pm, completion_mask.to(pm.dtype)], dim=1)
    hidden = {"output_hidden_states": True} if value_head is not None else {}
    out = lm(input_ids=ids[:, :-1], attention_mask=attn[:, :-1], position_ids=positions(attn)[:, :-1], use_cache=False,
             **hidden)
    logits = out.logits[:, Lp - 1:]  # prompts are left-padded: index Lp - 1 is every row's last prompt token
    h = out.hidden_states[-1][:, Lp - 1:] if hidden else None
    return _scores(logits, completion_ids, temperature, with_entropy, value_head, h)
