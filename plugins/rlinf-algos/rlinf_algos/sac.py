"""Soft Actor-Critic (Haarnoja et al., 2018) on ``transitions`` rollouts, with RL from demonstrations.

- Twin (or K) Q heads; the target takes the minimum over Polyak-averaged target copies (TD3's
  clipped double Q), bootstraps through time-limit truncation and stops at termination.
- A tanh-squashed Gaussian actor maximising min-Q minus the entropy term.
- Automatic entropy temperature: alpha is learned so that the policy's entropy tracks
  ``target_entropy`` (default: minus the action dimension).
- ``utd``: gradient steps per collected env step (the update-to-data ratio).
- Pixels: ``image_shift`` > 0 shifts every image of a batch by up to that many pixels (DrQ's random
  shift, Kostrikov et al., 2020: pad by repeating the border, crop at a random offset), drawn
  independently for the observation and the next observation.
- From demonstrations (``rlinf rl algo=sac demos=<dataset>``): every batch draws
  ``demo_fraction`` of its transitions from the demonstrations (RLPD's symmetric sampling, Ball
  et al., 2023), and ``bc_coef`` > 0 adds a behaviour-cloning term on them (squared error of the
  actor's mean action, as in TD3+BC: the log-likelihood would shrink the action std against the
  entropy temperature).

The three losses have disjoint parameters (Q heads; actor; temperature: the actor's loss reads
the Q heads through detached weights), so one backward and one optimizer step of the core's
engine update all three, as separate optimizers with the same learning rate would. The model
provides the networks through the off-policy interface of rlinf_cli/policy.py (``model=mlp``
has it: ``model.squash`` and ``model.q_heads``, which this algorithm sets on a fresh model).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

from rlinf_cli.api import Algorithm, RolloutSpec, TrainConfig, TransitionBatch, UserError


@dataclass(frozen=True)
class SACConfig(TrainConfig):
    rollout_steps: int = 8  # env steps per env per iteration (then the gradient steps)
    buffer_size: int = 1_000_000  # replay capacity in transitions (per rank)
    warmup_steps: int = 5_000  # env steps with uniform random actions before learning starts
    utd: float = 1.0  # gradient steps per env step (update-to-data ratio)
    gamma: float = 0.99  # discount
    tau: float = 0.005  # Polyak step of the target Q heads
    q_heads: int = 2  # Q heads; the target is their minimum
    target_entropy: float | None = None  # null = minus the action dimension
    init_temperature: float = 1.0  # initial entropy temperature alpha
    demo_fraction: float = 0.5  # with demos=: share of every batch drawn from the demonstrations
    bc_coef: float = 0.0  # with demos=: weight of a behaviour-cloning term on the demonstrations
    image_shift: int = 0  # pixels: random-shift augmentation of image observations by up to this many pixels (DrQ: 4)
    max_grad_norm: float | None = None  # SAC is usually run without clipping
    minibatch_size: int = 256  # transitions per gradient step
    epochs: int = 1  # unused (gradient steps come from utd)

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.rollout_steps < 1 or self.buffer_size < 1 or self.warmup_steps < 0:
            raise ValueError("rollout_steps and buffer_size must be >= 1 and warmup_steps >= 0")
        if self.utd <= 0 or not 0.0 < self.tau <= 1.0 or not 0.0 < self.gamma <= 1.0:
            raise ValueError("utd must be > 0, tau in (0, 1] and gamma in (0, 1]")
        if self.q_heads < 1 or not 0.0 <= self.demo_fraction < 1.0 or self.bc_coef < 0 or self.image_shift < 0:
            raise ValueError("q_heads must be >= 1, demo_fraction in [0, 1), bc_coef >= 0 and image_shift >= 0")


class SAC(Algorithm):
    Config = SACConfig
    name = "sac"
    rollout = "transitions"
    uses_critic = False
    uses_q = True
    # env.normalize_*=auto stays off: SAC is commonly run unnormalized (SB3's zoo, CleanRL), and on
    # Pendulum it gained nothing (docs/algorithms.md); env.normalize_obs=true still turns it on
    normalize_auto = False

    def __init__(self, config: SACConfig):
        super().__init__(config)
        self._target_entropy: float | None = None

    def rollout_spec(self) -> RolloutSpec:
        c = self.config
        return RolloutSpec("transitions", steps=c.rollout_steps, buffer_size=c.buffer_size, batch_size=c.minibatch_size,
                           warmup_steps=c.warmup_steps, demo_fraction=c.demo_fraction)

    def model_options(self) -> dict[str, Any]:
        return {"squash": True, "q_heads": self.config.q_heads, "critic": False,
                "init_temperature": self.config.init_temperature}

    def check(self, spec: Any) -> None:
        if spec.discrete:
            raise UserError("SAC learns continuous actions; this simulator's are discrete (use algo=ppo)")
        if spec.action.low is None or spec.action.high is None:
            raise UserError("SAC squashes actions into the simulator's bounds; this simulator declares none")
        self._target_entropy = (-float(math.prod(spec.action.shape)) if self.config.target_entropy is None
                                else float(self.config.target_entropy))

    def start(self, policy: Any, from_checkpoint: bool) -> str | None:
        """A run from a checkpoint (a squashed clone, an earlier SAC run) starts at this run's
        ``init_temperature``, not the one the checkpoint stored: a clone's default of 1.0 makes the
        entropy bonus outweigh a sparse success reward and walks the actor off the demonstrations
        (measured on pick-place-v3 from a 26% clone: training success 2% after 8k steps)."""
        if not from_checkpoint:
            return None
        with torch.no_grad():
            had = float(policy.log_alpha.exp())
            policy.log_alpha.fill_(math.log(self.config.init_temperature))
        return (f"the entropy temperature starts at algo.init_temperature={self.config.init_temperature:g} "
                f"(the checkpoint's: {had:.3g})")

    def gradient_steps(self, collected_before: int, collected: int) -> int:
        """``utd`` per transition collected after the warm-up (fractions carry over)."""
        w, utd = self.config.warmup_steps, self.config.utd
        return math.floor(utd * max(0, collected - w)) - math.floor(utd * max(0, collected_before - w))

    def transition_loss(self, policy: Any, b: TransitionBatch) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        c = self.config
        if c.image_shift:
            b = b._replace(obs=augment(b.obs, c.image_shift), next_obs=augment(b.next_obs, c.image_shift))
        log_alpha = policy.log_alpha
        alpha = log_alpha.detach().exp()
        with torch.no_grad():
            next_a, next_logp = policy.sample(b.next_obs)
            next_q = policy.q_values(b.next_obs, next_a, target=True).min(0).values
            target = b.rewards + c.gamma * (1.0 - b.terminated) * (next_q - alpha * next_logp)
        q = policy.q_values(b.obs, b.actions)  # [K, B]
        # 0.5 * mean over the batch, summed over heads; written with few autograd nodes (at SAC's
        # sizes each node's dispatch costs more than its arithmetic)
        critic_loss = (q - target).square().sum().mul(0.5 / q.shape[1])
        action, logp = policy.sample(b.obs)
        q_pi = policy.q_values(b.obs, action, detach=True).min(0).values
        actor_loss = (alpha * logp - q_pi).mean()
        logp_mean = logp.detach().mean()
        # -mean(log_alpha (logp + target)) with the scalar log_alpha taken out of the mean
        alpha_loss = log_alpha * (-(logp_mean + self._target_entropy))
        loss = critic_loss + actor_loss + alpha_loss
        stats = {"critic_loss": critic_loss.detach(), "actor_loss": actor_loss.detach(), "alpha": alpha,
                 "entropy": -logp_mean, "q_mean": q.detach().mean()}
        if c.bc_coef > 0:  # squared error of the actor's mean action on the demonstrations (TD3+BC-style):
            # unlike their log-likelihood, it leaves the action std to the entropy temperature
            demo = b.demo
            n = demo.sum().clamp_min(1.0)
            err = ((policy.mean_action(b.obs) - b.actions.float()) ** 2).sum(-1)
            bc = (err * demo).sum() / n
            loss = loss + c.bc_coef * bc
            stats["bc_loss"] = bc.detach()
        stats["demo_fraction"] = b.demo.mean()
        return loss, stats

    def after_step(self, policy: Any) -> None:
        policy.update_targets(self.config.tau)


def random_shift(images: torch.Tensor, pad: int) -> torch.Tensor:
    """[B, H, W, C] images, each shifted by a random offset in [-pad, pad] per axis; pixels moved in
    from outside repeat the border (replicate padding). Keeps the dtype (uint8 stays uint8)."""
    n, h, w = images.shape[:3]
    dy = torch.randint(-pad, pad + 1, (n, 1), device=images.device)
    dx = torch.randint(-pad, pad + 1, (n, 1), device=images.device)
    rows = (torch.arange(h, device=images.device) + dy).clamp_(0, h - 1)  # [B, H]
    cols = (torch.arange(w, device=images.device) + dx).clamp_(0, w - 1)  # [B, W]
    b = torch.arange(n, device=images.device)[:, None, None]
    return images[b, rows[:, :, None], cols[:, None, :]]


def augment(obs: dict[str, Any], pad: int) -> dict[str, Any]:
    """Random shift of every image entry ([B, H, W, C] uint8) of an observation batch."""
    return {k: random_shift(v, pad) if isinstance(v, torch.Tensor) and v.dtype == torch.uint8 and v.dim() == 4 else v
            for k, v in obs.items()}
