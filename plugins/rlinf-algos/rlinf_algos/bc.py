"""Behaviour cloning: maximise the likelihood of the demonstrated actions (used by `rlinf sft`)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from rlinf_cli.algorithm import Algorithm, TrainConfig
from rlinf_cli.policy import Policy


@dataclass(frozen=True)
class BCConfig(TrainConfig):
    loss: str = "nll"  # nll: -log pi(a_expert | s); mse: squared error of the mean action (continuous)
    lr: float = 1e-3
    epochs: int = 50
    minibatch_size: int = 256
    max_grad_norm: float | None = 1.0
    patience: int | None = None  # stop after this many epochs without a better validation loss

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.loss not in ("nll", "mse"):
            raise ValueError(f"loss must be 'nll' or 'mse', got {self.loss!r}")


class BC(Algorithm):
    Config = BCConfig
    name = "bc"
    rollout = "supervised"
    uses_critic = False

    def supervised_loss(self, policy: Policy, obs: dict[str, torch.Tensor], actions: torch.Tensor) -> torch.Tensor:
        """Mean loss over a batch of (observation, expert action) pairs."""
        if self.config.loss == "mse":
            if policy.env_spec.discrete:
                raise ValueError("mse behaviour cloning needs continuous actions; use algo.loss=nll")
            return ((policy.mean_action(obs) - actions) ** 2).sum(-1).mean()
        return -policy.evaluate(obs, actions).logprob.mean()
