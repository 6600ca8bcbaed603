"""REINFORCE with a batch-mean baseline, showing rlinf's Algorithm contract.

The core collects whole episodes (``rollout = "episodes"``), calls ``advantages`` once per
batch and ``loss`` per minibatch; it owns the optimizer, checkpoints and logging.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from rlinf_cli.algorithm import Algorithm, MiniBatch, TrainConfig, masked_mean
from rlinf_cli.policy import EvalOutput


@dataclass(frozen=True)
class Config(TrainConfig):
    group_size: int = 8  # episodes per group (all reset from the same seed)
    groups: int = 2  # groups per iteration
    epochs: int = 1


class Algo(Algorithm):
    Config = Config
    name = "{{name}}"
    rollout = "episodes"
    uses_critic = False

    def advantages(self, batch) -> tuple[torch.Tensor, torch.Tensor]:
        """Each step of episode n gets (R_n - mean R): [T, N]."""
        r = batch.episode_returns
        adv = (r - r.mean()).unsqueeze(0) * batch.mask
        return adv, torch.zeros_like(adv)

    def loss(self, out: EvalOutput, mb: MiniBatch) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        loss = -masked_mean(out.logprob * mb.advantages, mb.mask)
        return loss, {"policy_loss": loss.detach()}
