"""A linear policy showing rlinf's Policy contract: replace the layers with your network.

``Model(config, env_spec)``; ``act`` samples (or takes the mode), ``evaluate`` scores given
actions, ``get_value`` is the critic. Saving/loading (safetensors + config.json) is inherited.
"""

from __future__ import annotations

import math
from typing import Any, Mapping

import torch
from torch import nn

from rlinf_cli.api import EnvSpec
from rlinf_cli.policy import ActOutput, EvalOutput, Policy


class Model(Policy):
    def __init__(self, config: Mapping[str, Any], env_spec: EnvSpec):
        super().__init__(config, env_spec)
        in_dim = sum(math.prod(s.shape) for s in env_spec.observation.values() if len(s.shape) <= 1)
        out_dim = env_spec.num_actions if env_spec.discrete else math.prod(env_spec.action.shape)
        self.pi = nn.Linear(in_dim, out_dim)
        self.v = nn.Linear(in_dim, 1)
        if not env_spec.discrete:
            self.log_std = nn.Parameter(torch.full((out_dim,), float(config.get("log_std_init", 0.0))))

    def _x(self, obs: dict[str, torch.Tensor]) -> torch.Tensor:
        return torch.cat([v.reshape(v.shape[0], -1).float() for k, v in sorted(obs.items()) if v.dim() <= 2], -1)

    def _dist(self, obs: dict[str, torch.Tensor]) -> torch.distributions.Distribution:
        out = self.pi(self._x(obs))
        if self.env_spec.discrete:
            return torch.distributions.Categorical(logits=out)
        return torch.distributions.Independent(torch.distributions.Normal(out, self.log_std.exp()), 1)

    def act(self, obs: dict[str, torch.Tensor], deterministic: bool = False) -> ActOutput:
        dist = self._dist(obs)
        if deterministic:
            action = dist.probs.argmax(-1) if self.env_spec.discrete else dist.mean
        else:
            action = dist.sample()
        return ActOutput(action, dist.log_prob(action), self.get_value(obs))

    def evaluate(self, obs: dict[str, torch.Tensor], action: torch.Tensor) -> EvalOutput:
        dist = self._dist(obs)
        return EvalOutput(dist.log_prob(action), dist.entropy(), self.get_value(obs))

    def get_value(self, obs: dict[str, torch.Tensor]) -> torch.Tensor:
        return self.v(self._x(obs)).squeeze(-1)

    def mean_action(self, obs: dict[str, torch.Tensor]) -> torch.Tensor:
        return self.pi(self._x(obs))
