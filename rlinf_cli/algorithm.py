"""What an algorithm plugin provides: the whole contract between an algorithm and the core.

An RL algorithm is an advantage estimator plus a loss, configured by a frozen dataclass derived
from :class:`TrainConfig`. The core owns collection, minibatching, the optimizer (an engine),
checkpoints and logging, and it reads an algorithm only through the methods of
:class:`Algorithm` (never its config fields by name); the defaults of those methods read the
conventional fields (``rollout_steps``, ``groups``, ``group_size`` and TrainConfig's).
Algorithms stay one readable file each, and any of them trains any model that implements the
policy interface, embodied or language (see docs/plugins.md and docs/architecture.md).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Callable, ClassVar, Mapping, NamedTuple

import torch

from rlinf_cli import settings
from rlinf_cli.errors import UserError

#: The kinds of experience an algorithm can learn from:
#: "steps": fixed-length segments from continuing envs, [T, N] (PPO, A2C);
#: "episodes": whole episodes in groups that start from one seed or prompt (GRPO, RLOO);
#: "transitions": single steps sampled from a replay buffer (off-policy algorithms);
#: "supervised": a dataset of demonstrations (behaviour cloning, SFT).
ROLLOUT_KINDS = ("steps", "episodes", "transitions", "supervised")


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


def linear_decay(done: float) -> float:
    """Learning-rate factor falling linearly from 1 to 0 over the run (``done``: fraction of it done)."""
    return max(1.0 - done, 0.0)


#: Adam's epsilon unless an algorithm declares its own (CleanRL's and the PPO paper's 1e-5, not torch's 1e-8).
ADAM_EPS = 1e-5


@dataclass(frozen=True)
class OptimSpec:
    """How an algorithm wants its parameters optimised: Adam (AdamW with ``weight_decay``) with
    these settings. The algorithm declares it (:attr:`Algorithm.optim`); the engine runs it and
    decides nothing of it (rlinf_cli/runtime/engine.py)."""

    lr: float  # the learning rate the run starts with
    # learning-rate factor of the fraction of the run done (``lr * schedule(done)``);
    # None: the rate stays as it is
    schedule: Callable[[float], float] | None = None
    max_grad_norm: float | None = None  # clip the global gradient norm to this; None: no clipping
    weight_decay: float = 0.0  # > 0: AdamW's decoupled weight decay
    eps: float = ADAM_EPS  # Adam's epsilon


@dataclass(frozen=True)
class RolloutSpec:
    """The shape of the experience an algorithm wants per iteration."""

    kind: str  # one of ROLLOUT_KINDS
    steps: int = 0  # "steps" and "transitions": steps per env per iteration
    groups: int = 0  # "episodes": groups per iteration
    group_size: int = 1  # "episodes": members per group (all from the same seed or prompt)
    buffer_size: int = 0  # "transitions": replay buffer capacity (transitions per rank)
    batch_size: int = 0  # "transitions": transitions per gradient step
    warmup_steps: int = 0  # "transitions": env steps (per rank) with uniform random actions before learning
    demo_fraction: float = 0.0  # "transitions": share of every batch drawn from demonstrations (rl demos=...)


# Config fields the default methods read, per rollout kind (besides TrainConfig's).
ROLLOUT_KEYS: dict[str, tuple[str, ...]] = {"steps": ("rollout_steps",), "episodes": ("groups", "group_size")}


def required_config_keys(rollout: str) -> tuple[str, ...]:
    """Config fields an algorithm relying on the default methods must have."""
    return tuple(f.name for f in dataclasses.fields(TrainConfig)) + ROLLOUT_KEYS.get(rollout, ())


class MiniBatch(NamedTuple):
    """Experience for one gradient step (B = samples, optional T = tokens)."""

    old_logprob: torch.Tensor  # [B] or [B, T]
    advantages: torch.Tensor  # [B] or [B, T]
    returns: torch.Tensor  # [B] value targets (zeros without a critic), or [B, T] per token (text with a critic)
    old_values: torch.Tensor  # [B] (or [B, T]) values at collection time
    mask: torch.Tensor | None = None  # [B, T] valid tokens; None = all valid
    ref_logprob: torch.Tensor | None = None  # [B, T] frozen reference (KL penalty)
    obs: Any = None  # what ``policy.evaluate`` reads (laid out by the collector)
    actions: Any = None  # the actions taken (supervised: the demonstrated ones)


class TransitionBatch(NamedTuple):
    """Transitions sampled from the replay buffer for one gradient step ([B] leading)."""

    obs: Any  # dict of [B, ...] tensors, as the policy reads them (normalized when the run normalizes)
    actions: torch.Tensor  # [B, *action_shape] in the env's units
    rewards: torch.Tensor  # [B] (scaled when the run normalizes rewards)
    next_obs: Any  # observation after the step (the final one where the episode ended)
    terminated: torch.Tensor  # [B] 1.0 where the episode ended by the env (no bootstrap); time limits are 0
    demo: torch.Tensor  # [B] 1.0 for transitions from demonstrations (a behaviour-cloning term)


class Algorithm:
    """Base class: subclasses set ``Config``, ``name``, ``rollout`` and ``uses_critic`` and
    override :meth:`advantages` and :meth:`loss` (or :meth:`supervised_loss`)."""

    Config: ClassVar[type] = TrainConfig
    name: ClassVar[str] = ""
    rollout: ClassVar[str] = "steps"  # one of ROLLOUT_KINDS
    uses_critic: ClassVar[bool] = True  # needs a model with a value head
    uses_q: ClassVar[bool] = False  # needs a model with Q heads (the off-policy interface of Policy)
    # env.normalize_*=auto may turn running normalization on for it where the simulator recommends
    # it (rlinf_cli/runtime/normalize.py: resolve); False keeps auto off (SAC: off-policy practice)
    normalize_auto: ClassVar[bool] = True

    def __init__(self, config: Any):
        self.config = config

    @classmethod
    def from_config(cls, node: Mapping[str, Any] | None) -> "Algorithm":
        config = settings.build(cls.Config, node, "algo")
        if cls.rollout not in ROLLOUT_KINDS:
            raise UserError(f"algorithm '{cls.name or cls.__name__}' declares rollout='{cls.rollout}'; "
                            f"it must be one of {', '.join(ROLLOUT_KINDS)}")
        defaults = [k for k in ("rollout_spec", "optim", "epochs", "minibatch_size")
                    if getattr(cls, k) is getattr(Algorithm, k)]
        missing = [k for k in required_config_keys(cls.rollout) if not hasattr(config, k)] if defaults else []
        if missing:
            raise UserError(
                f"algorithm '{cls.name or cls.__name__}': its Config ({cls.Config.__name__}) lacks "
                f"{', '.join(repr(k) for k in missing)}, which rlinf's core reads for rollout='{cls.rollout}'. "
                f"Derive the Config from rlinf_cli.algorithm.TrainConfig and add the missing fields "
                f"(with their defaults in its conf/algo/<name>.yaml); see docs/plugins.md")
        return cls(config)

    # -- what the core asks ----------------------------------------------------------------
    def rollout_spec(self) -> RolloutSpec:
        """The experience to collect each iteration."""
        c = self.config
        if self.rollout == "steps":
            return RolloutSpec("steps", steps=int(c.rollout_steps))
        if self.rollout == "episodes":
            return RolloutSpec("episodes", groups=int(c.groups), group_size=int(c.group_size))
        return RolloutSpec(self.rollout)

    @property
    def optim(self) -> OptimSpec:
        """The optimizer settings the engine runs: by default TrainConfig's ``lr``, ``anneal_lr``
        (a linear decay to 0), ``max_grad_norm`` and ``weight_decay``, with Adam's eps 1e-5. An
        algorithm with other needs declares its own here."""
        c = self.config
        return OptimSpec(lr=float(c.lr), schedule=linear_decay if c.anneal_lr else None,
                         max_grad_norm=c.max_grad_norm, weight_decay=float(c.weight_decay or 0.0), eps=ADAM_EPS)

    @property
    def epochs(self) -> int:
        """Passes over each batch of experience (or over the dataset, for supervised learning)."""
        return int(self.config.epochs)

    @property
    def minibatch_size(self) -> int:
        """Samples per gradient step (text: completions, rounded down to whole groups)."""
        return int(self.config.minibatch_size)

    def needs_reference(self) -> bool:
        """True: minibatches carry ``ref_logprob`` from a frozen copy of the starting policy."""
        return False

    def start(self, policy: Any, from_checkpoint: bool) -> str | None:
        """Once, on a run's first start (not on resume), before the optimizer is made: set what the
        algorithm owns but the model stores (SAC's entropy temperature) to the run's settings, where
        an ``init=`` checkpoint (``from_checkpoint``) brought its own. Returns a line for the
        run's notes, or None."""
        return None

    def critic_only(self, iteration: int, from_checkpoint: bool) -> bool:
        """True: this iteration trains the critic alone (e.g. warming it up under a cloned actor)."""
        return False

    def critic_only_lr(self) -> float | None:
        """Learning rate of the critic-only iterations (None = the run's current one). A critic
        warmed up at an actor's fine-tuning rate barely moves (measured on model=vla: explained
        variance ~0 after 15 iterations at 3e-5, ~0.3 at 1e-3)."""
        return None

    def refill_rounds(self) -> int:
        """Group rollouts: extra draws to refill groups :meth:`filter_groups` dropped."""
        return 0

    def filter_groups(self, returns: torch.Tensor) -> torch.Tensor | None:
        """Group rollouts: bool mask [num_groups] of groups to keep, from episode returns [N] (None = all)."""
        return None

    def check(self, spec: Any) -> None:
        """Refuse an environment this algorithm cannot learn from (raise UserError with one line)."""

    def model_options(self) -> dict[str, Any]:
        """Model config entries a fresh model needs for this algorithm (merged over ``model.*``;
        e.g. SAC's squashed actor and Q heads). A model without such options is refused."""
        return {}

    # -- rollout = "transitions" (off-policy) -----------------------------------------------------
    def gradient_steps(self, collected_before: int, collected: int) -> int:
        """Gradient steps after this rank's count of collected transitions went from
        ``collected_before`` to ``collected`` (the update-to-data ratio; a function of the counts
        alone, so a resumed run takes the same steps)."""
        return int(self.epochs)

    def transition_loss(self, policy: Any, batch: TransitionBatch) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """``rollout = "transitions"``: scalar loss and diagnostics of one replay batch."""
        raise NotImplementedError

    def after_step(self, policy: Any) -> None:
        """Called after every optimizer step (e.g. Polyak averaging of target networks)."""

    # -- the algorithm ---------------------------------------------------------------------
    def advantages(self, exp: Any) -> tuple[torch.Tensor, torch.Tensor]:
        """``(advantages, returns)`` [T, N] for an :class:`~rlinf_cli.experience.Experience`."""
        raise NotImplementedError

    def loss(self, out: Any, mb: MiniBatch) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """Scalar loss to minimise and detached diagnostics, from ``policy.evaluate(mb.obs, mb.actions)``."""
        raise NotImplementedError

    def supervised_loss(self, policy: Any, mb: MiniBatch) -> torch.Tensor:
        """``rollout = "supervised"``: the loss of a minibatch of demonstrations (mb.obs, mb.actions, mb.mask)."""
        raise NotImplementedError

    def stop_early(self, stats: Mapping[str, float]) -> bool:
        """Checked after every epoch with the epoch's mean diagnostics."""
        return False

    # -- demonstrations beside on-policy RL (rl demos=, or the init= clone's own dataset) -------
    def demo_coef(self, done: float) -> float:
        """Weight of an imitation loss on a minibatch of demonstrations added to every on-policy
        minibatch's loss (DAPG-style), ``done`` being the fraction of the run's budget used; 0 = none."""
        return 0.0

    def demo_loss(self, policy: Any, mb: MiniBatch) -> torch.Tensor:
        """The imitation loss that :meth:`demo_coef` weighs (demonstrated ``mb.obs`` / ``mb.actions``)."""
        return imitation_loss(policy, mb, "mse")


IMITATION_LOSSES = ("nll", "mse")


def imitation_loss(policy: Any, mb: MiniBatch, kind: str) -> torch.Tensor:
    """Mean loss of a minibatch of demonstrations (``mb.obs``, ``mb.actions``, optional token ``mb.mask``):
    ``nll``: -log pi(a_expert | s), or the model's own imitation loss where its likelihood is not
    the one to train (a flow head: flow matching); ``mse``: squared error of the mean action
    (continuous actions; leaves a Gaussian's std alone, which the likelihood would shrink)."""
    if kind == "mse":
        return ((policy.mean_action(mb.obs) - mb.actions) ** 2).sum(-1).mean()
    own = policy.imitation_loss(mb.obs, mb.actions) if hasattr(policy, "imitation_loss") else None  # a pre-1.3 model has no hook
    if own is not None:
        return own
    return -masked_mean(policy.evaluate(mb.obs, mb.actions).logprob, mb.mask)


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


def reference_kl(logprob: torch.Tensor, mb: MiniBatch) -> torch.Tensor:
    """k3 KL(reference || policy) over the minibatch's valid samples: the penalty of ``kl_coef``
    terms against drifting from the frozen starting policy (``needs_reference``)."""
    assert mb.ref_logprob is not None, "reference_kl needs minibatches with ref_logprob (needs_reference)"
    return masked_mean(approx_kl(mb.ref_logprob - logprob), mb.mask)
