"""RLOO: REINFORCE with a leave-one-out baseline (Kool et al., 2019; Ahmadian et al., 2024).

Each of the G samples of a group is judged against the mean return of the *other* G - 1:
``A_i = R_i - mean_{j != i} R_j``. The baseline does not depend on the sample itself, so the
gradient estimate stays unbiased, and no std division rescales easy or hard groups. The loss
(token-level clipped surrogate, clip-higher, optional KL) and the rollouts are GRPO's.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from rlinf_algos.grpo import GRPO, GRPOConfig


@dataclass(frozen=True)
class RLOOConfig(GRPOConfig):
    """GRPO's settings; ``eps`` and ``scale_by_std`` are not used (RLOO does not divide by a std)."""

    epochs: int = 1  # RLOO is usually run on-policy: one pass per batch


def leave_one_out_advantages(returns: torch.Tensor, group_size: int) -> torch.Tensor:
    """R_i - mean of the other members of i's group, for returns [B] laid out group after group; -> [B]."""
    g = returns.reshape(-1, group_size)
    baseline = (g.sum(dim=1, keepdim=True) - g) / (group_size - 1)
    return (g - baseline).reshape(-1)


class RLOO(GRPO):
    Config = RLOOConfig
    name = "rloo"

    def outcome_advantages(self, returns: torch.Tensor) -> torch.Tensor:
        return leave_one_out_advantages(returns, self.config.group_size)
