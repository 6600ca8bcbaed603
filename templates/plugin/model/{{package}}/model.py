"""A linear policy showing rlinf's Policy contract: replace the layers with your network.

``Model(config, env_spec)``; ``act`` samples (or takes the mode), ``evaluate`` scores given
actions, ``get_value`` is the critic. Saving/loading (safetensors + config.json) is inherited.

``obs`` holds every entry the simulator gives, batch first: numeric entries as torch tensors
(vectors ``[B, d]``, images ``[B, H, W, C]`` uint8) and text entries (``ArraySpec((), "str")``,
e.g. Meta-World's instruction) as numpy object arrays of strings ``[B]``. The model declares the
entries it reads (``observation_keys``; here ``model.obs_keys``) and touches no other.
"""

from __future__ import annotations

import math
from typing import Any, Mapping

import torch
from torch import nn

from rlinf_cli.api import EnvSpec, UserError, ActOutput, EvalOutput, Policy


def numeric_keys(env_spec: EnvSpec, wanted: Any) -> tuple[str, ...]:
    """The observation entries this linear model reads: ``wanted`` (checked), or by default every
    numeric entry of at most one dimension (no images: a linear layer on pixels learns little; no text)."""
    obs = env_spec.observation
    if not wanted:
        return tuple(k for k, s in sorted(obs.items()) if not s.is_text and len(s.shape) <= 1)
    keys = tuple(str(k) for k in wanted)
    for k in keys:
        if k not in obs:
            raise UserError(f"model.obs_keys names '{k}', which the simulator does not give; it gives {sorted(obs)}")
        if obs[k].is_text or len(obs[k].shape) > 1:
            raise UserError(f"model.obs_keys names '{k}', a {'text' if obs[k].is_text else 'image'} entry; this "
                            f"linear model reads numeric vectors only (drop it from model.obs_keys)")
    return keys


class Model(Policy):
    def __init__(self, config: Mapping[str, Any], env_spec: EnvSpec):
        super().__init__(config, env_spec)
        self._keys = numeric_keys(env_spec, self.config.get("obs_keys"))
        if not self._keys:
            raise UserError(f"the simulator gives no numeric vector observation for this linear model "
                            f"(it gives {sorted(env_spec.observation)})")
        in_dim = sum(math.prod(env_spec.observation[k].shape) for k in self._keys)
        out_dim = env_spec.num_actions if env_spec.discrete else math.prod(env_spec.action.shape)
        self.pi = nn.Linear(in_dim, out_dim)
        self.v = nn.Linear(in_dim, 1)
        if not env_spec.discrete:
            self.log_std = nn.Parameter(torch.full((out_dim,), float(config.get("log_std_init", 0.0))))

    @property
    def observation_keys(self) -> tuple[str, ...]:
        # what the simulator must give and a checkpoint is checked against; the rest is ignored
        return self._keys

    def critic_parameters(self) -> list[nn.Parameter]:
        # the value head alone: PPO's critic warm-up after `rl init=` trains these and nothing else
        return list(self.v.parameters())

    def _x(self, obs: dict[str, Any]) -> torch.Tensor:
        return torch.cat([obs[k].reshape(obs[k].shape[0], -1).float() for k in self._keys], -1)

    def _dist(self, obs: dict[str, Any]) -> torch.distributions.Distribution:
        out = self.pi(self._x(obs))
        if self.env_spec.discrete:
            return torch.distributions.Categorical(logits=out)
        return torch.distributions.Independent(torch.distributions.Normal(out, self.log_std.exp()), 1)

    def act(self, obs: dict[str, Any], deterministic: bool = False) -> ActOutput:
        dist = self._dist(obs)
        if deterministic:
            action = dist.probs.argmax(-1) if self.env_spec.discrete else dist.mean
        else:
            action = dist.sample()
        return ActOutput(action, dist.log_prob(action), self.get_value(obs))

    def evaluate(self, obs: dict[str, Any], action: torch.Tensor) -> EvalOutput:
        dist = self._dist(obs)
        return EvalOutput(dist.log_prob(action), dist.entropy(), self.get_value(obs))

    def get_value(self, obs: dict[str, Any]) -> torch.Tensor:
        return self.v(self._x(obs)).squeeze(-1)

    def mean_action(self, obs: dict[str, Any]) -> torch.Tensor:
        return self.pi(self._x(obs))
