"""PPO's loss as one autograd node with a hand-written backward: the fast path of
:meth:`rlinf_algos.ppo.PPO.loss` (``algo.fused_loss``, on by default).

The readable loss is ``PPO.loss`` in ppo.py; this module computes the same numbers (the forward
runs its ops in the same order) and hands each input its gradient in closed form instead of
autograd walking ~25 nodes of 256-element ops per minibatch, whose bookkeeping costs more than
their maths (1.19x per minibatch together with the MLP's fused evaluate, docs/benchmarks.md).
``tests/unit/test_ppo_fused_loss.py`` checks loss, diagnostics and gradients against the readable path.
PPO calls :func:`applies`, then :func:`loss`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from rlinf_cli.api import EvalOutput, MiniBatch, approx_kl

if TYPE_CHECKING:
    from .ppo import PPOConfig


def applies(c: "PPOConfig", out: EvalOutput, mb: MiniBatch, adv: torch.Tensor) -> bool:
    """The fused loss covers per-sample log-probs, values and entropies in fp32 without a KL term
    (everything the embodied PPO computes); anything else takes :meth:`PPO.loss`'s autograd graph."""
    return (torch.is_grad_enabled() and (c.kl_coef == 0 or mb.ref_logprob is None)
            and out.logprob.dim() == 1 and out.logprob.shape == adv.shape == out.value.shape == out.entropy.shape
            and all(t.dtype == torch.float32 for t in (out.logprob, out.value, out.entropy, adv, mb.old_logprob,
                                                      mb.returns, mb.old_values)))


def loss(c: "PPOConfig", out: EvalOutput, mb: MiniBatch,
         adv: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """:meth:`PPO.loss` (``adv`` already normalised) through :class:`FusedLoss`: the same loss and
    diagnostics, gradients in closed form. Call only where :func:`applies`."""
    stats: dict[str, torch.Tensor] = {}
    total, stats["value_loss_raw"] = FusedLoss.apply(out.logprob, out.value, out.entropy, mb.old_logprob, adv,
                                                     mb.returns, mb.old_values, c, stats)
    return total, stats


class FusedLoss(torch.autograd.Function):
    """PPO's loss and its value term alone (the critic warm-up's loss) as one autograd node.

    The forward runs the ops of :meth:`PPO.loss` in the same order (the same numbers, the
    diagnostics included); the backward hands each input its gradient in closed form instead of
    walking ~25 autograd nodes of 256-element ops per minibatch, whose bookkeeping costs more than
    their maths. d pg_i / d logp_i is -adv_i * ratio_i where the unclipped term is the maximum
    (where the clip binds, or the dual clip caps a negative advantage, it is 0); the value term's
    is value_coef * (v_i - R_i) where the unclipped square is the larger; the entropy's is
    -entropy_coef. Each mean divides by N. ``tests/unit/test_ppo_fused_loss.py`` checks it against
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
