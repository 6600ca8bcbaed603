"""What an algorithm plugin provides, and the helpers they share.

An RL algorithm is an advantage estimator plus a loss, configured by a frozen dataclass.
The core owns rollouts, minibatching, the optimizer, checkpoints and logging; algorithms stay
one readable file each.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Mapping, NamedTuple

import torch

from rlinf_cli import settings
from rlinf_cli.errors import UserError


@dataclass(frozen=True)
class TrainConfig:
    """Optimisation settings every algorithm has."""

    lr: float = 3e-4  # Adam learning rate
    anneal_lr: bool = False  # decay the learning rate linearly to 0 over the run
    epochs: int = 4  # passes over each batch of experience
    minibatch_size: int = 256  # samples (steps or sequences) per gradient step
    max_grad_norm: float | None = 0.5  # global gradient-norm clip; null disables
    weight_decay: float = 0.0  # AdamW weight decay

    def __post_init__(self) -> None:
        if self.lr <= 0:
            raise ValueError(f"lr must be > 0, got {self.lr}")
        if self.epochs < 1 or self.minibatch_size < 1:
            raise ValueError("epochs and minibatch_size must be >= 1")


# What the core reads from an algorithm's config, besides TrainConfig's fields, per rollout kind.
ROLLOUT_KEYS: dict[str, tuple[str, ...]] = {
    "steps": ("rollout_steps",),  # steps per env per iteration
    "episodes": ("groups", "group_size"),  # groups x episodes reset from one seed
    "supervised": (),
}


def required_config_keys(rollout: str) -> tuple[str, ...]:
    """Config fields an algorithm with this rollout kind must have."""
    import dataclasses

    return tuple(f.name for f in dataclasses.fields(TrainConfig)) + ROLLOUT_KEYS.get(rollout, ())


class MiniBatch(NamedTuple):
    """Flattened experience for one gradient step (B = samples, optional T = tokens)."""

    old_logprob: torch.Tensor  # [B] or [B, T]
    advantages: torch.Tensor  # [B] or [B, T]
    returns: torch.Tensor  # [B] value targets (zeros without a critic)
    old_values: torch.Tensor  # [B]
    mask: torch.Tensor | None = None  # [B, T] valid tokens; None = all valid
    ref_logprob: torch.Tensor | None = None  # [B, T] frozen reference (KL penalty)


class Algorithm:
    """Base class: subclasses set ``Config``, ``name`` and ``rollout`` and override the methods."""

    Config: ClassVar[type] = TrainConfig
    name: ClassVar[str] = ""
    #: "steps": fixed-length rollouts from continuing envs (PPO); "episodes": whole episodes
    #: in groups reset from a shared seed (GRPO); "supervised": learns from a dataset (BC).
    rollout: ClassVar[str] = "steps"
    uses_critic: ClassVar[bool] = True

    def __init__(self, config: Any):
        self.config = config

    @classmethod
    def from_config(cls, node: Mapping[str, Any] | None) -> "Algorithm":
        config = settings.build(cls.Config, node, "algo")
        missing = [k for k in required_config_keys(cls.rollout) if not hasattr(config, k)]
        if missing:
            raise UserError(
                f"algorithm '{cls.name or cls.__name__}': its Config ({cls.Config.__name__}) lacks "
                f"{', '.join(repr(k) for k in missing)}, which rlinf's core reads for rollout='{cls.rollout}'. "
                f"Derive the Config from rlinf_cli.algorithm.TrainConfig and add the missing fields "
                f"(with their defaults in its conf/algo/<name>.yaml); see docs/plugins.md")
        return cls(config)

    def advantages(self, batch: Any) -> tuple[torch.Tensor, torch.Tensor]:
        """``(advantages, returns)`` for a rollout; see the subclass for shapes."""
        raise NotImplementedError

    def loss(self, out: Any, mb: MiniBatch) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """Scalar loss to minimise and detached diagnostics."""
        raise NotImplementedError

    def stop_early(self, stats: Mapping[str, float]) -> bool:
        """Checked after every epoch with the epoch's mean diagnostics."""
        return False

    def filter_groups(self, returns: torch.Tensor) -> torch.Tensor | None:
        """For group rollouts: bool mask [num_groups] of groups to keep (None = all)."""
        return None


def masked_mean(x: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    if mask is None:
        return x.mean()
    mask = mask.to(x.dtype)
    return (x * mask).sum() / mask.sum().clamp_min(1.0)


def clipped_surrogate(
    logratio: torch.Tensor,
    adv: torch.Tensor,
    clip_low: float,
    clip_high: float,
    dual_clip: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-sample PPO surrogate loss with asymmetric clip and optional dual clip.

    ``logratio`` and ``adv`` share a shape ([B] or [B, T]). Returns (loss, clipped_mask).
    Dual clip (Ye et al., 2020) caps the loss at ``dual_clip * |adv|`` for negative advantages,
    so one very off-policy sample cannot dominate a batch.
    """
    ratio = torch.exp(logratio)
    unclipped = -adv * ratio
    clipped = -adv * torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high)
    loss = torch.maximum(unclipped, clipped)
    if dual_clip is not None:
        loss = torch.where(adv < 0, torch.minimum(loss, -adv * dual_clip), loss)
    return loss, (clipped > unclipped)


def approx_kl(logratio: torch.Tensor) -> torch.Tensor:
    """Schulman's k3 estimator of KL(old || new), per sample."""
    return torch.expm1(logratio) - logratio
