"""A2C written only against rlinf's documented algorithm contract (docs/plugins.md): n-step
returns on a "steps" rollout, one gradient step per rollout. It trains embodied policies (with a
critic) and language models (without one: a batch-mean baseline) through the same `rlinf rl`."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from rlinf_cli.algorithm import Algorithm, MiniBatch, TrainConfig, masked_mean


@dataclass(frozen=True)
class A2CConfig(TrainConfig):
    rollout_steps: int = 8  # steps per env per iteration
    gamma: float = 0.99  # discount
    value_coef: float = 0.5  # weight of the value loss
    entropy_coef: float = 0.0  # weight of the entropy bonus
    epochs: int = 1  # one pass ...
    minibatch_size: int = 1_000_000  # ... in one minibatch: one gradient step per rollout
    lr: float = 7e-4


class A2C(Algorithm):
    Config = A2CConfig
    name = "a2c"
    rollout = "steps"
    uses_critic = False  # uses one when the model has it (values are zeros otherwise)

    def advantages(self, exp):
        ret = torch.zeros_like(exp.rewards)
        running = exp.last_value
        for t in reversed(range(exp.rewards.shape[0])):  # n-step returns, cut at episode ends
            running = exp.rewards[t] + self.config.gamma * (running * (1.0 - exp.dones[t]) + exp.trunc_values[t])
            ret[t] = running
        critic = bool(exp.values.abs().sum() > 0)
        adv = ret - (exp.values if critic else ret.mean())
        return adv, ret

    def loss(self, out, mb: MiniBatch):
        adv = mb.advantages
        pg = -masked_mean(out.logprob * adv, mb.mask)
        value = 0.5 * ((out.value - mb.returns) ** 2).mean()
        entropy = masked_mean(out.entropy, mb.mask)
        loss = pg + self.config.value_coef * value - self.config.entropy_coef * entropy
        return loss, {"policy_loss": pg.detach(), "value_loss": value.detach(), "entropy": entropy.detach()}
