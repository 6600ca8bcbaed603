"""Behaviour cloning: maximise the likelihood of the demonstrated actions (used by `rlinf sft`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from rlinf_cli.api import IMITATION_LOSSES, Algorithm, MiniBatch, Policy, TrainConfig, UserError, imitation_loss


@dataclass(frozen=True)
class BCConfig(TrainConfig):
    loss: str = "nll"  # nll: -log pi(a_expert | s), or the model's own imitation loss (flow head: flow matching); mse: squared error of the mean action (continuous)
    lr: float = 1e-3
    epochs: int = 50
    minibatch_size: int = 256
    max_grad_norm: float | None = 1.0
    patience: int | None = None  # stop after this many epochs without a better validation loss

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.loss not in IMITATION_LOSSES:
            raise ValueError(f"loss must be 'nll' or 'mse', got {self.loss!r}")


class BC(Algorithm):
    Config = BCConfig
    name = "bc"
    rollout = "supervised"
    uses_critic = False

    def check(self, spec: Any) -> None:
        if self.config.loss == "mse" and spec.discrete:
            raise UserError("algo.loss=mse needs continuous actions; this dataset has discrete actions: use algo.loss=nll")

    def supervised_loss(self, policy: Policy, mb: MiniBatch) -> torch.Tensor:
        """Mean loss over a minibatch of demonstrations: (observation, expert action) pairs, or
        token sequences whose ``mb.mask`` marks the tokens to imitate."""
        return imitation_loss(policy, mb, self.config.loss)
