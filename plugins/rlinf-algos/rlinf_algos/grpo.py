"""Group Relative Policy Optimisation (Shao et al., 2024) with DAPO's refinements (Yu et al., 2025).

A group is G episodes (or G completions of one prompt) that start from the same state. Each
member's advantage is its outcome relative to the group: (R - mean) / (std + eps). No critic.
- clip-higher: asymmetric clip range [1 - clip_low, 1 + clip_high] keeps exploration alive;
- token-level loss: every valid step/token weighs the same, whatever its episode's length
  (``loss_agg=token``; ``sequence`` is the original GRPO's mean of per-sequence token means, under
  which a long completion's tokens each weigh less);
- group filtering: groups whose returns are all equal carry no signal and can be dropped;
  text tasks then draw fresh prompts to refill the batch (DAPO's dynamic sampling).
Variants that change only the advantage (RLOO, REINFORCE++) subclass this file's GRPO and
override :meth:`GRPO.outcome_advantages`; the loss and the rollouts stay the same.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from rlinf_cli.api import (Algorithm, MiniBatch, TrainConfig, approx_kl, clipped_surrogate, masked_mean, reference_kl,
                           EvalOutput, Experience)


LOSS_AGG = ("token", "sequence")


@dataclass(frozen=True)
class GRPOConfig(TrainConfig):
    group_size: int = 8  # G: episodes (or samples) per group, from the same seed (or prompt)
    groups: int = 4  # groups per iteration
    epochs: int = 4
    eps: float = 1e-6  # added to the group std
    scale_by_std: bool = True  # false: Dr. GRPO's (R - mean) without the std division
    clip_low: float = 0.2  # ratio clip below: 1 - clip_low
    clip_high: float = 0.28  # ratio clip above: 1 + clip_high (DAPO clip-higher)
    dual_clip: float | None = None  # optional dual clip for negative advantages
    filter_groups: bool = False  # drop groups whose returns are all equal (no learning signal)
    refill_rounds: int = 3  # text tasks with filter_groups: extra prompt draws to refill dropped groups
    entropy_coef: float = 0.0  # entropy bonus
    kl_coef: float = 0.0  # weight of k3 KL to a frozen reference policy (0 = no reference)
    loss_agg: str = "token"  # token: mean over all valid tokens (DAPO) | sequence: mean of per-sequence means

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.loss_agg not in LOSS_AGG:
            raise ValueError(f"loss_agg must be one of {', '.join(LOSS_AGG)}, got {self.loss_agg!r}")
        if self.group_size < 2:
            raise ValueError(f"group_size must be >= 2 for group-relative advantages, got {self.group_size}")
        if self.groups < 1:
            raise ValueError("groups must be >= 1")
        if self.clip_low <= 0 or self.clip_high <= 0:
            raise ValueError("clip_low and clip_high must be > 0")
        if self.refill_rounds < 0:
            raise ValueError("refill_rounds must be >= 0")


def group_advantages(returns: torch.Tensor, group_size: int, eps: float = 1e-6, scale: bool = True) -> torch.Tensor:
    """(R - group mean) / (group std + eps) for returns [B] laid out group after group; -> [B]."""
    g = returns.reshape(-1, group_size)
    centred = g - g.mean(dim=1, keepdim=True)
    if scale:
        centred = centred / (g.std(dim=1, keepdim=True, unbiased=True) + eps)
    return centred.reshape(-1)


def aggregate(x: torch.Tensor, mask: torch.Tensor | None, how: str) -> torch.Tensor:
    """Mean of per-token values ``x`` over valid tokens: all tokens alike (``token``) or each
    sequence (a row of a [B, T] token mask) alike (``sequence``). Step-level minibatches ([B]: one
    step per row) have no sequences, and both modes are the plain masked mean there."""
    if how == "token" or mask is None or mask.dim() < 2:
        return masked_mean(x, mask)
    mask = mask.to(x.dtype)
    per_seq = (x * mask).sum(-1) / mask.sum(-1).clamp_min(1.0)
    return masked_mean(per_seq, (mask.sum(-1) > 0).to(x.dtype))


def informative_groups(returns: torch.Tensor, group_size: int) -> torch.Tensor:
    """bool [num_groups]: groups whose members' returns are not all equal."""
    g = returns.reshape(-1, group_size)
    return (g.max(dim=1).values - g.min(dim=1).values) > 1e-8


class GRPO(Algorithm):
    Config = GRPOConfig
    name = "grpo"
    rollout = "episodes"
    uses_critic = False

    def outcome_advantages(self, returns: torch.Tensor) -> torch.Tensor:
        """Per-episode advantage from per-episode returns [B] -> [B]."""
        c = self.config
        return group_advantages(returns, c.group_size, c.eps, c.scale_by_std)

    def advantages(self, exp: Experience) -> tuple[torch.Tensor, torch.Tensor]:
        """Every valid step of an episode (every token of a completion) gets that episode's
        advantage: [T, N]."""
        assert exp.episode_returns is not None, "GRPO needs whole-episode rollouts"
        adv = self.outcome_advantages(exp.episode_returns).unsqueeze(0) * exp.mask
        return adv, torch.zeros_like(adv)

    def filter_groups(self, returns: torch.Tensor) -> torch.Tensor | None:
        return informative_groups(returns, self.config.group_size) if self.config.filter_groups else None

    def refill_rounds(self) -> int:
        return self.config.refill_rounds if self.config.filter_groups else 0

    def needs_reference(self) -> bool:
        return self.config.kl_coef > 0

    def loss(self, out: EvalOutput, mb: MiniBatch) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        c = self.config
        logratio = out.logprob - mb.old_logprob
        pg, clipped = clipped_surrogate(logratio, mb.advantages, c.clip_low, c.clip_high, c.dual_clip)
        pg_loss = aggregate(pg, mb.mask, c.loss_agg)
        entropy = aggregate(out.entropy, mb.mask, c.loss_agg)
        loss = pg_loss - c.entropy_coef * entropy
        stats = {}
        if c.kl_coef > 0 and mb.ref_logprob is not None:
            kl = reference_kl(out.logprob, mb)
            loss = loss + c.kl_coef * kl
            stats["kl_ref"] = kl.detach()
        with torch.no_grad():
            stats.update({
                "policy_loss": pg_loss,
                "entropy": entropy,
                "approx_kl": masked_mean(approx_kl(logratio), mb.mask),
                "clip_frac": masked_mean(clipped.float(), mb.mask),
            })
        return loss, stats
