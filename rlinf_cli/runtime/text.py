"""Text rollouts and the token-level update: the LLM side of the GRPO family.

A text policy (``rlinf-model-hf``'s ``HFCausalLM`` or any model with the same methods) provides:

- ``encode_prompts(list[str]) -> list[list[int]]`` and ``encode_text(str)``, ``decode(ids)``;
- ``generate(prompt_ids, samples=G, max_new_tokens=, greedy=, stop=, generator=)`` returning
  tokens [B, T], per-token log-probs [B, T], lengths [B] and a finish reason per row;
- ``token_logprobs(prompt_ids, prompt_mask, completion_ids, completion_mask, group_size)``
  returning differentiable (logprobs, entropy) [B, T];
- ``eos_token_id``, ``pad_token_id``, ``device``.

A rollout samples G completions per prompt in one batched call, runs tool turns for
multi-turn tasks (tool output is context: its tokens get loss mask 0), and scores every
completion with the task. The update reuses the algorithm's advantage and loss exactly as the
embodied trainer does: :meth:`outcome_advantages` per completion, :meth:`loss` on a token-level
:class:`MiniBatch`. Log-probs computed while sampling serve as the old log-probs.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Sequence

import torch

from rlinf_cli.algorithm import Algorithm, MiniBatch
from rlinf_cli.api import Score, TextSample, TextTask
from rlinf_cli.policy import EvalOutput


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
class TokenBatch:
    """Completions as tensors: P prompts (groups) x G samples, group after group."""

    prompt_ids: torch.Tensor  # [P, Lp] left-padded
    prompt_mask: torch.Tensor  # [P, Lp]
    ids: torch.Tensor  # [P*G, T] completion tokens, right-padded
    attn: torch.Tensor  # [P*G, T] 1 for every real token (tool output included)
    loss_mask: torch.Tensor  # [P*G, T] 1 for tokens the policy wrote
    old_logprobs: torch.Tensor  # [P*G, T]
    rewards: torch.Tensor  # [P*G]
    group_size: int

    @property
    def groups(self) -> int:
        return self.prompt_ids.shape[0]

    def select(self, groups: torch.Tensor) -> "TokenBatch":
        rows = (groups.unsqueeze(1) * self.group_size + torch.arange(self.group_size)).reshape(-1)
        return TokenBatch(self.prompt_ids[groups], self.prompt_mask[groups], self.ids[rows], self.attn[rows],
                          self.loss_mask[rows], self.old_logprobs[rows], self.rewards[rows], self.group_size)


@dataclass
class RolloutStats:
    seconds: float = 0.0
    generated_tokens: int = 0  # tokens written by the policy
    prompts_drawn: int = 0
    groups_dropped: int = 0
    extra: dict[str, float] = field(default_factory=dict)


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
        toks = gen.tokens[i, :n].tolist()
        out.append(Completion(samples[i // group_size], toks, [1] * n, gen.logprobs[i, :n].tolist(), finish=gen.finish[i]))
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


def to_batch(policy: Any, completions: Sequence[Completion], group_size: int) -> TokenBatch:
    """Completions (groups contiguous) -> padded tensors on the policy's device."""
    dev = policy.device
    pad = policy.pad_token_id
    samples = [completions[g * group_size].sample for g in range(len(completions) // group_size)]
    prompts = policy.encode_prompts([s.prompt for s in samples])
    width = max(len(p) for p in prompts)
    prompt_ids = torch.full((len(prompts), width), pad, dtype=torch.long)
    prompt_mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for i, p in enumerate(prompts):
        prompt_ids[i, width - len(p):] = torch.tensor(p, dtype=torch.long)
        prompt_mask[i, width - len(p):] = 1
    T = max(1, max(len(c.tokens) for c in completions))
    B = len(completions)
    ids = torch.full((B, T), pad, dtype=torch.long)
    attn = torch.zeros((B, T), dtype=torch.long)
    loss_mask = torch.zeros((B, T))
    old = torch.zeros((B, T))
    for i, c in enumerate(completions):
        n = len(c.tokens)
        if n:
            ids[i, :n] = torch.tensor(c.tokens, dtype=torch.long)
            attn[i, :n] = 1
            loss_mask[i, :n] = torch.tensor(c.loss_mask, dtype=torch.float32)
            old[i, :n] = torch.tensor(c.logprobs, dtype=torch.float32)
    rewards = torch.tensor([c.score.reward if c.score else 0.0 for c in completions], dtype=torch.float32)
    return TokenBatch(prompt_ids.to(dev), prompt_mask.to(dev), ids.to(dev), attn.to(dev), loss_mask.to(dev),
                      old.to(dev), rewards.to(dev), group_size)


def collect_groups(policy: Any, task: TextTask, algo: Algorithm, seeds: Sequence[int], refill_seeds: Any,
                   max_new_tokens: int, generator: torch.Generator | None = None
                   ) -> tuple[list[Completion], list[Completion], RolloutStats]:
    """Sample ``len(seeds)`` groups; with the algorithm's group filter, refill dropped groups.

    ``refill_seeds(round) -> seeds`` gives fresh prompts for refill round 1, 2, ... Returns
    ``(kept completions, every completion sampled, stats)``; kept groups are at most ``len(seeds)``.
    """
    c = algo.config
    G = c.group_size
    stats = RolloutStats()
    t0 = time.perf_counter()
    kept: list[Completion] = []
    seen: list[Completion] = []
    want = len(seeds)
    draw = list(seeds)
    rounds = int(getattr(c, "refill_rounds", 0)) if getattr(c, "filter_groups", False) else 0
    for r in range(rounds + 1):
        comps = sample_completions(policy, task, task.prompts(draw), G, max_new_tokens, generator=generator)
        seen += comps
        stats.prompts_drawn += len(draw)
        returns = torch.tensor([x.score.reward for x in comps], dtype=torch.float32)
        keep = algo.filter_groups(returns)
        for g in range(len(draw)):
            if keep is None or bool(keep[g]):
                kept += comps[g * G:(g + 1) * G]
            else:
                stats.groups_dropped += 1
        have = len(kept) // G
        if have >= want or r == rounds:
            break
        draw = list(refill_seeds(r + 1))[: want - have]
    kept = kept[: want * G]
    stats.seconds = time.perf_counter() - t0
    stats.generated_tokens = sum(sum(x.loss_mask) for x in seen)
    return kept, seen, stats


def update(engine: Any, algo: Algorithm, batch: TokenBatch, generator: torch.Generator,
           ref_policy: Any = None) -> dict[str, float]:
    """Epochs of shuffled minibatches of whole groups; returns mean diagnostics.

    ``minibatch_size`` counts completions and is rounded down to whole groups (at least one).
    """
    policy = engine.module
    c = algo.config
    G = batch.group_size
    adv = algo.outcome_advantages(batch.rewards).unsqueeze(1) * batch.loss_mask  # [B, T]
    ref = None
    if getattr(c, "kl_coef", 0.0) > 0 and ref_policy is not None:
        with torch.no_grad():
            ref, _ = ref_policy.token_logprobs(batch.prompt_ids, batch.prompt_mask, batch.ids, batch.attn, G,
                                               with_entropy=False)
    n_groups = batch.groups
    per_mb = max(1, min(n_groups, int(c.minibatch_size) // G))
    sums: dict[str, float] = {}
    count = 0
    policy.train()
    for _epoch in range(int(c.epochs)):
        perm = torch.randperm(n_groups, generator=generator)
        epoch_stats: dict[str, float] = {}
        steps = 0
        for start in range(0, n_groups, per_mb):
            g = perm[start:start + per_mb]
            mb = batch.select(g)
            rows = (g.unsqueeze(1) * G + torch.arange(G)).reshape(-1).to(adv.device)
            logp, entropy = policy.token_logprobs(mb.prompt_ids, mb.prompt_mask, mb.ids, mb.attn, G)
            zeros = torch.zeros(logp.shape[0], device=logp.device)
            loss, stats = algo.loss(EvalOutput(logp, entropy, zeros),
                                    MiniBatch(mb.old_logprobs, adv[rows], zeros, zeros, mb.loss_mask,
                                              None if ref is None else ref[rows]))
            engine.backward(loss)
            norm = engine.step()
            if norm is not None:
                stats["grad_norm"] = norm
            for k, v in stats.items():
                epoch_stats[k] = epoch_stats.get(k, 0.0) + float(v.detach() if torch.is_tensor(v) else v)
            steps += 1
        for k, v in epoch_stats.items():
            sums[k] = sums.get(k, 0.0) + v
        count += steps
        if algo.stop_early({k: v / max(steps, 1) for k, v in epoch_stats.items()}):
            break
    policy.eval()
    out = {f"train/{k}": v / max(count, 1) for k, v in sums.items() if not k.endswith("_raw")}
    out["train/gradient_steps"] = float(count)
    out["train/completions"] = float(batch.ids.shape[0])
    return out


def accuracy(completions: Sequence[Completion]) -> float:
    return sum(bool(c.score and c.score.correct) for c in completions) / max(len(completions), 1)
