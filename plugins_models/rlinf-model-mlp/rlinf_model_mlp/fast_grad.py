"""The Gaussian actor-critic's ``evaluate`` as one autograd node with a hand-written backward.

PPO's update runs thousands of minibatches through two small MLPs (64x64 at 256 rows: ~27
MFLOP forward and backward, ~0.8-1 ms of matrix products on one core of this VM), and each
minibatch also pays per-op overhead: under autograd ~230 tensor ops (recording the graph, the
engine's queue, a backward node per op with its transposes and accumulations). Here the forward
runs the same ops as :meth:`MLPPolicy.evaluate` (so log-probs and values are bit-identical)
without recording them, and the backward computes every gradient directly: per layer one product
for the weights, one sum for the bias, one product and one activation-backward op for the layer
below. Measured on Ant-v5 sizes: 1.035x per minibatch from this node alone, 1.19x together with
PPO's fused loss (``rlinf_algos/ppo.py``); ``benchmarks/ppo_update.py`` times the whole update.
The same idea for SAC's 256-wide networks gave nothing (docs/benchmarks.md): there the step is
products, not bookkeeping. ``tests/unit/test_fast_grad.py`` checks outputs and gradients against
autograd.

Used for continuous actions with a state-independent std (PPO's Gaussian), tanh or ReLU, fp32
outside mixed precision, and not under DeepSpeed ZeRO-3 (whose module hooks gather the weights);
everything else keeps autograd (``model.fast_grad=false`` turns it off).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from .model import MLPPolicy

_LOG_SQRT_2PI = 0.5 * math.log(2 * math.pi)
_ACTIVATIONS = ("tanh", "relu")


def supported(policy: "MLPPolicy") -> bool:
    """Whether ``policy``'s configuration can take the fused evaluate at all (per call, see :func:`applies`)."""
    return (not policy.env_spec.discrete and not policy.squash and policy.cfg.activation in _ACTIVATIONS)


def applies(policy: "MLPPolicy", x: torch.Tensor, action: torch.Tensor) -> bool:
    """Whether this call can take it: gradients wanted, fp32 without autocast or oneDNN's bf16 mode,
    weights local (no ZeRO-3 hooks)."""
    from rlinf_cli.api import onednn_bf16_active

    return (torch.is_grad_enabled() and x.dtype == torch.float32 and action.dtype == torch.float32
            and x.dim() == 2 and not torch.is_autocast_enabled(x.device.type) and not onednn_bf16_active()
            and not hasattr(policy.actor_layers[0].weight, "ds_id"))


def evaluate(policy: "MLPPolicy", x: torch.Tensor, action: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(log-prob [B], value [B]) of ``action`` under ``policy`` at features ``x``; value is zeros
    without a critic (as :meth:`MLPPolicy.get_value`)."""
    actor = [t for lin in policy.actor_layers for t in (lin.weight, lin.bias)]
    critic = [t for lin in policy.critic_layers for t in (lin.weight, lin.bias)]
    logp, value = _GaussianEvaluate.apply(x, action, policy.log_std, len(actor), policy.cfg.activation == "relu",
                                          *actor, *critic)
    return logp, (value if critic else x.new_zeros(x.shape[0]))


def _forward(x: torch.Tensor, params: tuple[torch.Tensor, ...], relu: bool) -> list[torch.Tensor]:
    """Inputs of every layer, then the output: ``F.linear`` on 2-d inputs is this ``addmm``."""
    hs = [x]
    last = len(params) // 2 - 1
    for i in range(last + 1):
        y = torch.addmm(params[2 * i + 1], hs[-1], params[2 * i].t())
        if i < last:
            y = torch.relu(y) if relu else torch.tanh(y)
        hs.append(y)
    return hs


def _backward(g: torch.Tensor, hs: list[torch.Tensor], params: tuple[torch.Tensor, ...], relu: bool,
              need_x: bool) -> tuple[list[torch.Tensor], torch.Tensor | None]:
    """Gradients of weights and biases (in ``params`` order) and of the input, from the output's ``g``."""
    n = len(params) // 2
    grads: list[torch.Tensor] = [g] * (2 * n)
    for i in reversed(range(n)):
        # autograd's orientation (input^T @ grad, transposed): 2.5x faster than grad^T @ input in
        # fp32 for a first layer of 14-105 inputs (measured, MKL), the same for square layers
        grads[2 * i] = hs[i].t().mm(g).t()
        grads[2 * i + 1] = g.sum(0)
        if i == 0 and not need_x:
            return grads, None
        g = g.mm(params[2 * i])
        if i > 0:  # through the activation, from its output (what autograd's backward ops use)
            g = torch.ops.aten.threshold_backward(g, hs[i], 0) if relu else torch.ops.aten.tanh_backward(g, hs[i])
    return grads, g


class _GaussianEvaluate(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, action: torch.Tensor, log_std: torch.Tensor, n_actor: int, relu: bool,
                *params: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        actor, critic = params[:n_actor], params[n_actor:]
        hs_a = _forward(x, actor, relu)
        inv_std = torch.exp(-log_std)
        z = (action - hs_a[-1]) * inv_std  # MLPPolicy._gauss_logp, op for op
        logp = (-0.5 * z * z - log_std - _LOG_SQRT_2PI).sum(-1)
        hs_c = _forward(x, critic, relu) if critic else []
        value = hs_c[-1].squeeze(-1) if critic else logp.new_zeros(())
        ctx.n_actor, ctx.n_params, ctx.n_hidden_a, ctx.relu = n_actor, len(params), len(hs_a) - 1, relu
        # the layers' outputs are kept without their last (the backward needs inputs of layers only)
        ctx.save_for_backward(z, inv_std, *params, *hs_a[:-1], *hs_c[:-1])
        ctx.set_materialize_grads(False)
        return logp, value

    @staticmethod
    def backward(ctx: Any, g_logp: torch.Tensor | None, g_value: torch.Tensor | None) -> tuple[Any, ...]:
        saved = ctx.saved_tensors
        z, inv_std = saved[0], saved[1]
        params, hs = saved[2:2 + ctx.n_params], saved[2 + ctx.n_params:]
        actor, critic = params[:ctx.n_actor], params[ctx.n_actor:]
        hs_a, hs_c = hs[:ctx.n_hidden_a], hs[ctx.n_hidden_a:]
        need_x = ctx.needs_input_grad[0]
        g_x = g_log_std = None
        g_actor: list[Any] = [None] * len(actor)
        g_critic: list[Any] = [None] * len(critic)
        if g_logp is not None:
            gz = g_logp.unsqueeze(-1) * z
            # d logp / d mean = z / std; d logp / d log_std = z^2 - 1 (through z and the -log_std term)
            if ctx.needs_input_grad[2]:
                g_log_std = (gz * z).sum(0) - g_logp.sum()
            g_actor, g_x = _backward(gz * inv_std, list(hs_a), actor, ctx.relu, need_x)
        if g_value is not None and critic:
            g_critic, g_xc = _backward(g_value.unsqueeze(-1), list(hs_c), critic, ctx.relu, need_x)
            if g_xc is not None:
                g_x = g_xc if g_x is None else g_x + g_xc
        return (g_x, None, g_log_std, None, None, *g_actor, *g_critic)
