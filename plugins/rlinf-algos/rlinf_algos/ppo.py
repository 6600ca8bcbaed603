"""Proximal Policy Optimisation (Schulman et al., 2017) with the details that matter.

- GAE(lambda) advantages; truncated episodes bootstrap from the value of their final state.
- Clipped surrogate, plus dual clip (Ye et al., 2020) for negative advantages.
- Clipped value loss (as in the OpenAI baselines), entropy bonus.
- Per-minibatch advantage normalisation; optional early stop when approx KL > target_kl.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from rlinf_cli.api import (Algorithm, MiniBatch, TrainConfig, approx_kl, clipped_surrogate, reference_kl, EvalOutput,
                           Experience)


@dataclass(frozen=True)
class PPOConfig(TrainConfig):
    rollout_steps: int = 128  # steps per env per iteration
    gamma: float = 0.99  # discount
    gae_lambda: float = 0.95  # GAE lambda
    epochs: int = 10
    clip_ratio: float = 0.2  # surrogate clip epsilon
    dual_clip: float | None = 3.0  # dual-clip constant c > 1; null disables
    clip_value: float | None = 0.2  # value clip range around the old value; null = plain MSE
    value_coef: float = 0.5  # weight of the value loss
    entropy_coef: float = 0.0  # weight of the entropy bonus
    norm_adv: bool = True  # normalise advantages per minibatch
    target_kl: float | None = None  # stop the epoch loop once mean approx KL exceeds this
    critic_warmup_iters: int = 10  # first iterations train only the critic (RL from init=: a cloned actor)
    critic_warmup_lr: float | None = None  # learning rate of those critic-only iterations; null = lr
    kl_coef: float = 0.0  # weight of k3 KL to the frozen starting policy (RL from init=: keeps the clone's skills; 0 = off)
    fused_loss: bool = True  # the loss as one autograd node with closed-form gradients (same maths; see _FusedLoss)

    def __post_init__(self) -> None:
        super().__post_init__()
        if not 0.0 < self.gamma <= 1.0 or not 0.0 <= self.gae_lambda <= 1.0:
            raise ValueError("gamma must be in (0, 1] and gae_lambda in [0, 1]")
        if self.clip_ratio <= 0:
            raise ValueError(f"clip_ratio must be > 0, got {self.clip_ratio}")
        if self.dual_clip is not None and self.dual_clip <= 1.0:
            raise ValueError(f"dual_clip must be > 1 (or null), got {self.dual_clip}")
        if self.rollout_steps < 1:
            raise ValueError("rollout_steps must be >= 1")
        if self.critic_warmup_lr is not None and self.critic_warmup_lr <= 0:
            raise ValueError(f"critic_warmup_lr must be > 0 (or null = lr), got {self.critic_warmup_lr}")
        if self.kl_coef < 0:
            raise ValueError(f"kl_coef must be >= 0, got {self.kl_coef}")


def gae(rollout: Experience, gamma: float, lam: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalised advantage estimation over a [T, N] rollout.

    ``dones[t]`` ends the episode at step t: the next value belongs to a new episode and is
    not used; ``trunc_values[t]`` adds back the bootstrap for time-limit truncation.
    Returns (advantages [T, N], returns [T, N]).
    """
    # The recursion runs over T in Python; on [N]-sized rows numpy's ops cost a fraction of
    # torch's dispatch (same float32 arithmetic, so the same numbers).
    dev = rollout.values.device
    values, rewards, dones, trunc = (x.detach().cpu().numpy() for x in
                                     (rollout.values, rollout.rewards, rollout.dones, rollout.trunc_values))
    T = rewards.shape[0]
    adv = np.zeros_like(rewards)
    last = np.zeros_like(values[0])
    next_value = rollout.last_value.detach().cpu().numpy()
    for t in range(T - 1, -1, -1):
        nonterminal = 1.0 - dones[t]
        delta = rewards[t] + gamma * (next_value * nonterminal + trunc[t]) - values[t]
        last = delta + gamma * lam * nonterminal * last
        adv[t] = last
        next_value = values[t]
    adv_t = torch.from_numpy(adv).to(dev)
    return adv_t, adv_t + rollout.values


class PPO(Algorithm):
    Config = PPOConfig
    name = "ppo"
    rollout = "steps"
    uses_critic = True

    def advantages(self, exp: Experience) -> tuple[torch.Tensor, torch.Tensor]:
        return gae(exp, self.config.gamma, self.config.gae_lambda)

    def critic_only(self, iteration: int, from_checkpoint: bool) -> bool:
        """RL from a cloned policy: the first iterations train an untrained critic alone, so its
        advantages cannot walk the cloned actor away."""
        return from_checkpoint and iteration < self.config.critic_warmup_iters

    def critic_only_lr(self) -> float | None:
        return self.config.critic_warmup_lr

    def needs_reference(self) -> bool:
        return self.config.kl_coef > 0

    def loss(self, out: EvalOutput, mb: MiniBatch) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        c = self.config
        adv = mb.advantages
        if c.norm_adv and adv.numel() > 1:
            adv = (adv - adv.mean()) / (adv.std() + 1e-8)
        if _fused_applies(c, out, mb, adv):
            stats: dict[str, torch.Tensor] = {}
            loss, stats["value_loss_raw"] = _FusedLoss.apply(out.logprob, out.value, out.entropy, mb.old_logprob, adv,
                                                             mb.returns, mb.old_values, c, stats)
            return loss, stats
        logratio = out.logprob - mb.old_logprob
        pg, clipped = clipped_surrogate(logratio, adv, c.clip_ratio, c.clip_ratio, c.dual_clip)
        pg_loss = pg.mean()

        v = out.value
        # Critic warm-up (critic_only) minimises value_term_raw instead. Unclipped: value
        # clipping keeps V within clip_value of the rollout's values, which would let an untrained
        # critic move only clip_value per iteration towards returns it has never seen.
        if c.clip_value is not None:
            v_clipped = mb.old_values + torch.clamp(v - mb.old_values, -c.clip_value, c.clip_value)
            v_loss = 0.5 * torch.maximum((v - mb.returns) ** 2, (v_clipped - mb.returns) ** 2).mean()
            value_term, value_term_raw = c.value_coef * v_loss, c.value_coef * (0.5 * ((v - mb.returns) ** 2).mean())
        else:  # without clipping the two are one (no second graph per minibatch)
            v_loss = 0.5 * ((v - mb.returns) ** 2).mean()
            value_term = value_term_raw = c.value_coef * v_loss
        entropy = out.entropy.mean()
        loss = pg_loss + value_term - c.entropy_coef * entropy
        stats = {}
        if c.kl_coef > 0 and mb.ref_logprob is not None:
            kl = reference_kl(out.logprob, mb)
            loss = loss + c.kl_coef * kl
            stats["kl_ref"] = kl.detach()
        with torch.no_grad():
            stats.update({
                "policy_loss": pg_loss,
                "value_loss": v_loss,
                "entropy": entropy,
                "approx_kl": approx_kl(logratio).mean(),
                "clip_frac": clipped.float().mean(),
                "explained_variance": 1.0 - (mb.returns - v).var() / mb.returns.var().clamp_min(1e-8),
            })
        stats["value_loss_raw"] = value_term_raw
        return loss, stats

    def stop_early(self, stats) -> bool:
        return self.config.target_kl is not None and stats.get("approx_kl", 0.0) > self.config.target_kl


def _fused_applies(c: PPOConfig, out: EvalOutput, mb: MiniBatch, adv: torch.Tensor) -> bool:
    """The fused loss covers per-sample log-probs, values and entropies in fp32 without a KL term
    (everything the embodied PPO computes); anything else takes the autograd graph above."""
    return (c.fused_loss and torch.is_grad_enabled() and (c.kl_coef == 0 or mb.ref_logprob is None)
            and out.logprob.dim() == 1 and out.logprob.shape == adv.shape == out.value.shape == out.entropy.shape
            and all(t.dtype == torch.float32 for t in (out.logprob, out.value, out.entropy, adv, mb.old_logprob,
                                                      mb.returns, mb.old_values)))


class _FusedLoss(torch.autograd.Function):
    """PPO's loss and its value term alone (the critic warm-up's loss) as one autograd node.

    The forward runs the ops of :meth:`PPO.loss` in the same order (the same numbers, the
    diagnostics included); the backward hands each input its gradient in closed form instead of
    walking ~25 autograd nodes of 256-element ops per minibatch, whose bookkeeping costs more than
    their maths. d pg_i / d logp_i is -adv_i * ratio_i where the unclipped term is the maximum
    (where the clip binds, or the dual clip caps a negative advantage, it is 0); the value term's
    is value_coef * (v_i - R_i) where the unclipped square is the larger; the entropy's is
    -entropy_coef. Each mean divides by N. ``tests/test_ppo_fused_loss.py`` checks it against
    autograd's.
    """

    @staticmethod
    def forward(ctx, logp, value, entropy, old_logp, adv, returns, old_values, c, stats):  # type: ignore[override]
        logratio = logp - old_logp
        # clipped_surrogate, op for op (negation is exact: -adv once gives the same numbers)
        neg_adv, ratio = -adv, torch.exp(logratio)
        unclipped = neg_adv * ratio
        clipped = neg_adv * torch.clamp(ratio, 1.0 - c.clip_ratio, 1.0 + c.clip_ratio)
        pg = torch.maximum(unclipped, clipped)
        clipped_more = clipped > unclipped
        flows = ~clipped_more
        if c.dual_clip is not None:  # where the cap binds the loss no longer depends on the ratio
            pg = torch.where(adv < 0, torch.minimum(pg, neg_adv * c.dual_clip), pg)
            flows &= ~((adv < 0) & (pg < unclipped))
        pg_loss = pg.mean()
        diff = value - returns
        sq = diff ** 2
        if c.clip_value is not None:
            v_clipped = old_values + torch.clamp(value - old_values, -c.clip_value, c.clip_value)
            sq_clipped = (v_clipped - returns) ** 2
            v_loss = 0.5 * torch.maximum(sq, sq_clipped).mean()
            raw = c.value_coef * (0.5 * sq.mean())
            value_grad = diff * (sq >= sq_clipped)
        else:
            v_loss = 0.5 * sq.mean()
            raw = c.value_coef * v_loss
            value_grad = diff
        ent = entropy.mean()
        loss = pg_loss + c.value_coef * v_loss - c.entropy_coef * ent
        stats.update({"policy_loss": pg_loss, "value_loss": v_loss, "entropy": ent,
                      "approx_kl": approx_kl(logratio).mean(), "clip_frac": clipped_more.float().mean(),
                      "explained_variance": 1.0 - diff.var() / returns.var().clamp_min(1e-8)})
        ctx.save_for_backward(unclipped * flows, value_grad, diff)
        ctx.n, ctx.value_coef, ctx.entropy_coef = logp.numel(), c.value_coef, c.entropy_coef
        ctx.set_materialize_grads(False)
        return loss, raw

    @staticmethod
    def backward(ctx, g_loss, g_raw):  # type: ignore[override]
        logp_grad, value_grad, diff = ctx.saved_tensors
        g_logp = g_value = g_entropy = None
        if g_loss is not None:
            g_logp = logp_grad * (g_loss / ctx.n)
            g_value = value_grad * (g_loss * (ctx.value_coef / ctx.n))
            if ctx.entropy_coef and ctx.needs_input_grad[2]:
                g_entropy = (g_loss * (-ctx.entropy_coef / ctx.n)).expand(ctx.n)
        if g_raw is not None:
            g_v_raw = diff * (g_raw * (ctx.value_coef / ctx.n))
            g_value = g_v_raw if g_value is None else g_value + g_v_raw
        return g_logp, g_value, g_entropy, None, None, None, None, None, None
