"""An advantage actor-critic on ``steps`` rollouts, showing rlinf's whole algorithm contract.

The core collects experience (``rollout``: "steps" fixed-length segments from continuing envs;
"episodes" whole episodes in groups; "transitions" replay samples; "supervised" demonstrations),
calls :meth:`advantages` once per batch and :meth:`loss` per minibatch, and owns the optimizer,
checkpoints and logging. It reads nothing else of this file: no config field by name, no
modality. So this algorithm trains embodied policies and language models alike (see
rlinf's docs/plugins.md for every method the core may ask).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from rlinf_cli.api import (Algorithm, EvalOutput, Experience, MiniBatch, OptimSpec, TrainConfig, linear_decay,
                           masked_mean)


@dataclass(frozen=True)
class Config(TrainConfig):
    rollout_steps: int = 8  # steps per env per iteration ("steps" rollouts need it)
    gamma: float = 0.99  # discount
    value_coef: float = 0.5  # weight of the value loss
    epochs: int = 1  # one pass over each rollout ...
    minibatch_size: int = 1_000_000  # ... in one minibatch: one gradient step per rollout
    lr: float = 7e-4


class Algo(Algorithm):
    Config = Config
    name = "{{name}}"
    rollout = "steps"
    uses_critic = False  # uses the model's critic when it has one; a batch-mean baseline otherwise

    @property
    def optim(self) -> OptimSpec:
        """What the engine runs: Adam (eps 1e-5), the learning rate decayed linearly to 0 when
        ``anneal_lr`` is set, the gradient norm clipped to ``max_grad_norm``. Change it here."""
        c = self.config
        return OptimSpec(lr=float(c.lr), eps=1e-5, schedule=linear_decay if c.anneal_lr else None,
                         max_grad_norm=c.max_grad_norm, weight_decay=float(c.weight_decay or 0.0))

    def advantages(self, exp: Experience) -> tuple[torch.Tensor, torch.Tensor]:
        """n-step returns [T, N], cut at episode ends and bootstrapped at truncations and at the
        segment's end; advantage = return - V (or - the batch mean without a critic)."""
        ret = torch.zeros_like(exp.rewards)
        running = exp.last_value
        for t in reversed(range(exp.rewards.shape[0])):
            running = exp.rewards[t] + self.config.gamma * (running * (1.0 - exp.dones[t]) + exp.trunc_values[t])
            ret[t] = running
        critic = bool(exp.values.abs().sum() > 0)  # values are zeros when the model has no critic
        return ret - (exp.values if critic else ret.mean()), ret

    def loss(self, out: EvalOutput, mb: MiniBatch) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """``out = policy.evaluate(mb.obs, mb.actions)``; per-token shapes [B, T] for language
        models (``mb.mask`` marks the tokens the policy wrote), [B] for embodied policies."""
        pg = -masked_mean(out.logprob * mb.advantages, mb.mask)
        value = 0.5 * ((out.value - mb.returns) ** 2).mean()
        loss = pg + self.config.value_coef * value
        return loss, {"policy_loss": pg.detach(), "value_loss": value.detach()}
