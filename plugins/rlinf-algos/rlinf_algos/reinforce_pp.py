"""REINFORCE++ (Hu et al., 2025): REINFORCE with PPO's clipping and a batch-normalised advantage.

No critic and no per-group std: the advantage is normalised with the mean and std of the whole
batch, which is more stable than GRPO's per-group std when a group's returns are nearly equal.
- ``group_baseline: true`` (REINFORCE++-baseline): subtract each group's mean return first,
  then divide by the batch std: ``A = (R - mean_group) / std_batch``;
- ``group_baseline: false`` (plain REINFORCE++): ``A = (R - mean_batch) / std_batch``; groups of
  one sample are allowed.
The KL to a reference policy (``kl_coef``) and the clipped token-level loss are GRPO's.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from rlinf_algos.grpo import GRPO, GRPOConfig
from rlinf_cli.api import TrainConfig


@dataclass(frozen=True)
class ReinforcePPConfig(GRPOConfig):
    group_baseline: bool = True  # subtract the group mean before batch normalisation (REINFORCE++-baseline)
    epochs: int = 1  # passes over each batch

    def __post_init__(self) -> None:
        TrainConfig.__post_init__(self)
        minimum = 2 if self.group_baseline else 1
        if self.group_size < minimum:
            raise ValueError(f"group_size must be >= {minimum} (group_baseline={self.group_baseline})")
        if self.groups < 1 or self.clip_low <= 0 or self.clip_high <= 0 or self.refill_rounds < 0:
            raise ValueError("groups >= 1, clip_low/clip_high > 0 and refill_rounds >= 0 are required")


def batch_normalised_advantages(returns: torch.Tensor, group_size: int, group_baseline: bool, eps: float = 1e-6) -> torch.Tensor:
    """Advantages [B] from returns [B] (group after group): group- or batch-centred, batch-std scaled."""
    if group_baseline:
        g = returns.reshape(-1, group_size)
        centred = (g - g.mean(dim=1, keepdim=True)).reshape(-1)
    else:
        centred = returns - returns.mean()
    std = centred.std(unbiased=True) if centred.numel() > 1 else centred.new_tensor(0.0)
    return centred / (std + eps)


class ReinforcePP(GRPO):
    Config = ReinforcePPConfig
    name = "reinforce++"

    def outcome_advantages(self, returns: torch.Tensor) -> torch.Tensor:
        c = self.config
        return batch_normalised_advantages(returns, c.group_size, c.group_baseline, c.eps)
