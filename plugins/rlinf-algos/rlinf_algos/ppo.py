"""Proximal Policy Optimisation (Schulman et al., 2017) with the details that matter.

- GAE(lambda) advantages; truncated episodes bootstrap from the value of their final state.
  Language models: GAE over the tokens the policy wrote, the episode's reward at the last of them
  (tool output is skipped, :func:`gae`), and the loss's means over those tokens.
- Clipped surrogate, plus dual clip (Ye et al., 2020) for negative advantages.
- Clipped value loss (as in the OpenAI baselines), entropy bonus.
- Per-minibatch advantage normalisation; optional early stop when approx KL > target_kl.
- From a clone: a critic warm-up, a KL penalty to the clone (``kl_coef``) and an imitation term
  on its demonstrations beside every minibatch (``bc_coef``, DAPG-style: Rajeswaran et al., 2018).
- Adam with eps 1e-5, the learning rate optionally annealed linearly to 0, the global gradient
  norm clipped to max_grad_norm (``PPO.optim``: the engine runs what is declared there).

Read top to bottom: the config, the advantages (:func:`gae`), then the algorithm (its optimizer,
its loss). ``ppo_fused.py`` is the same loss with closed-form gradients (``fused_loss``), tested
equal to :meth:`PPO.loss`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from rlinf_cli.api import (IMITATION_LOSSES, Algorithm, EvalOutput, Experience, MiniBatch, OptimSpec, TrainConfig,
                           UserError, approx_kl, clipped_surrogate, imitation_loss, linear_decay, masked_mean,
                           reference_kl)

from . import ppo_fused


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
    bc_coef: float = 0.0  # weight of an imitation loss on demonstrations (rl demos=, or init='s SFT dataset) beside every minibatch; 0 = off
    bc_loss: str = "mse"  # that loss: mse of the mean action (continuous; leaves the exploration std alone) | nll (the model's imitation loss)
    bc_anneal: bool = False  # decay bc_coef linearly to 0 over the run
    fused_loss: bool = True  # the loss as one autograd node with closed-form gradients (same maths; ppo_fused.py)

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
        if self.bc_coef < 0 or self.bc_loss not in IMITATION_LOSSES:
            raise ValueError(f"bc_coef must be >= 0 and bc_loss one of {', '.join(IMITATION_LOSSES)}; "
                             f"got {self.bc_coef} and {self.bc_loss!r}")


def gae(rollout: Experience, gamma: float, lam: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalised advantage estimation over a [T, N] rollout, or over the policy's tokens of a
    text rollout (values [T, N, L] beside its ``token_mask``).

    ``dones[t]`` ends the episode at step t: the next value belongs to a new episode and is
    not used; ``trunc_values[t]`` adds back the bootstrap for time-limit truncation.
    Returns (advantages, returns), shaped like ``values``.

    Text: each token the policy wrote is a step, in order (step t's tokens, then step t+1's); a
    step's reward, end and bootstrap come at its last policy token (:func:`token_steps`). Tokens
    it did not write (a tool's output, padding) are no steps: the recursion passes over them with
    the running advantage and the next step's value unchanged, so gamma and lambda discount once
    per policy token, and the value after a tool call's last token is the one before the next
    turn's first (V of the state with the result in it). They get advantage 0.
    """
    # The recursion runs over T in Python; on [N]-sized rows numpy's ops cost a fraction of
    # torch's dispatch (same float32 arithmetic, so the same numbers).
    dev = rollout.values.device
    per_token = rollout.token_mask is not None
    values, rewards, dones, trunc, mask = token_steps(rollout) if per_token else (
        *(x.detach().cpu().numpy() for x in (rollout.values, rollout.rewards, rollout.dones, rollout.trunc_values)),
        None)
    S = rewards.shape[0]
    adv = np.zeros_like(rewards)
    last = np.zeros_like(values[0])
    zero = np.float32(0.0)
    next_value = rollout.last_value.detach().cpu().numpy()
    for t in range(S - 1, -1, -1):
        nonterminal = 1.0 - dones[t]
        delta = rewards[t] + gamma * (next_value * nonterminal + trunc[t]) - values[t]
        step = delta + gamma * lam * nonterminal * last
        if mask is None:
            last, next_value = step, values[t]
        else:  # not the policy's token: not a step
            step = np.where(mask[t], step, zero)
            last, next_value = np.where(mask[t], step, last), np.where(mask[t], values[t], next_value)
        adv[t] = step
    if per_token:
        T, N, L = rollout.token_mask.shape
        adv_t = torch.from_numpy(np.ascontiguousarray(adv.reshape(T, L, N).transpose(0, 2, 1))).to(dev)
        return adv_t, adv_t + torch.from_numpy(np.ascontiguousarray(values.reshape(T, L, N).transpose(0, 2, 1))).to(dev)
    adv_t = torch.from_numpy(adv).to(dev)
    return adv_t, adv_t + rollout.values


def token_steps(rollout: Experience) -> tuple[np.ndarray, ...]:
    """A text rollout as GAE's time axis: (values, rewards, dones, trunc_values, policy-token mask),
    each [T * L, N] (step t's L tokens, then step t+1's), the step's reward, done and bootstrap
    placed at its last policy token. Values given per step ([T, N]) hold for each of its tokens."""
    m = rollout.token_mask.detach().cpu().numpy() > 0
    T, N, L = m.shape
    v = rollout.values.detach().cpu().numpy().astype(np.float32)
    v = (v if v.ndim == 3 else np.broadcast_to(v[..., None], m.shape)) * m
    has = m.any(-1)  # a step without a policy token (nothing written) has no reward to place
    last = (L - 1 - np.argmax(m[..., ::-1], axis=-1))[..., None]

    def at_last(x: torch.Tensor) -> np.ndarray:
        out = np.zeros(m.shape, np.float32)
        np.put_along_axis(out, last, (x.detach().cpu().numpy() * has)[..., None].astype(np.float32), axis=-1)
        return out

    steps = (v, at_last(rollout.rewards), at_last(rollout.dones), at_last(rollout.trunc_values), m)
    return tuple(np.ascontiguousarray(x.transpose(0, 2, 1).reshape(T * L, N)) for x in steps)


def _bessel(mask: torch.Tensor) -> torch.Tensor:
    """n / (n - 1) over the mask's n valid entries: the unbiased variance, as ``Tensor.std``."""
    n = mask.sum()
    return n / (n - 1).clamp_min(1.0)


def explained_variance(v: torch.Tensor, returns: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """1 - Var(returns - v) / Var(returns), over the valid entries."""
    if mask is None:
        return 1.0 - (returns - v).var() / returns.var().clamp_min(1e-8)

    def var(x: torch.Tensor) -> torch.Tensor:
        return masked_mean((x - masked_mean(x, mask)) ** 2, mask) * _bessel(mask)

    return 1.0 - var(returns - v) / var(returns).clamp_min(1e-8)


class PPO(Algorithm):
    Config = PPOConfig
    name = "ppo"
    rollout = "steps"
    uses_critic = True

    @property
    def optim(self) -> OptimSpec:
        """Adam with CleanRL's eps (1e-5, not torch's 1e-8), the learning rate decayed linearly to 0
        over the run when ``anneal_lr`` is set, the global gradient norm clipped to ``max_grad_norm``."""
        c = self.config
        return OptimSpec(lr=float(c.lr), eps=1e-5, schedule=linear_decay if c.anneal_lr else None,
                         max_grad_norm=c.max_grad_norm, weight_decay=float(c.weight_decay or 0.0))

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

    def check(self, spec) -> None:
        if self.config.bc_coef > 0 and self.config.bc_loss == "mse" and spec.discrete:
            raise UserError("algo.bc_loss=mse needs continuous actions; these are discrete: use algo.bc_loss=nll")

    def demo_coef(self, done: float) -> float:
        c = self.config
        return c.bc_coef * (linear_decay(done) if c.bc_anneal else 1.0)

    def demo_loss(self, policy, mb: MiniBatch) -> torch.Tensor:
        return imitation_loss(policy, mb, self.config.bc_loss)

    def loss(self, out: EvalOutput, mb: MiniBatch) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """Embodied minibatches are [B] samples; text ones [B, T] tokens with ``mb.mask`` (the
        policy's tokens): every mean below is then over those tokens, each weighing the same."""
        c = self.config
        m = mb.mask
        adv = mb.advantages
        if c.norm_adv and adv.numel() > 1:
            if m is None:
                adv = (adv - adv.mean()) / (adv.std() + 1e-8)
            else:  # over the policy's tokens; the others stay 0
                mean = masked_mean(adv, m)
                std = (masked_mean((adv - mean) ** 2, m) * _bessel(m)).sqrt()
                adv = (adv - mean) / (std + 1e-8) * m
        if c.fused_loss and ppo_fused.applies(c, out, mb, adv):  # the same loss, gradients in closed form
            return ppo_fused.loss(c, out, mb, adv)
        logratio = out.logprob - mb.old_logprob
        pg, clipped = clipped_surrogate(logratio, adv, c.clip_ratio, c.clip_ratio, c.dual_clip)
        pg_loss = masked_mean(pg, m)

        v = out.value
        # Critic warm-up (critic_only) minimises value_term_raw instead. Unclipped: value
        # clipping keeps V within clip_value of the rollout's values, which would let an untrained
        # critic move only clip_value per iteration towards returns it has never seen.
        if c.clip_value is not None:
            v_clipped = mb.old_values + torch.clamp(v - mb.old_values, -c.clip_value, c.clip_value)
            v_loss = 0.5 * masked_mean(torch.maximum((v - mb.returns) ** 2, (v_clipped - mb.returns) ** 2), m)
            value_term, value_term_raw = c.value_coef * v_loss, c.value_coef * (0.5 * masked_mean((v - mb.returns) ** 2, m))
        else:  # without clipping the two are one (no second graph per minibatch)
            v_loss = 0.5 * masked_mean((v - mb.returns) ** 2, m)
            value_term = value_term_raw = c.value_coef * v_loss
        entropy = masked_mean(out.entropy, m)
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
                "approx_kl": masked_mean(approx_kl(logratio), m),
                "clip_frac": masked_mean(clipped.float(), m),
                "explained_variance": explained_variance(v, mb.returns, m),
            })
        stats["value_loss_raw"] = value_term_raw
        return loss, stats

    def stop_early(self, stats) -> bool:
        return self.config.target_kl is not None and stats.get("approx_kl", 0.0) > self.config.target_kl
