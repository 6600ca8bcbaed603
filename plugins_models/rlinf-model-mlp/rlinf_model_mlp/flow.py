"""A flow-matching action expert (the pi0 pattern), trained by RL through noise injection.

Shared by ``model=mlp model.head=flow`` and ``model=vla model.head=flow`` (rlinf-model-vla
imports this module; it depends on rlinf-model-mlp). The caller supplies the velocity field
``v(x_t, t)`` conditioned on its own features (the MLP: a network over observation features;
the VLA: action tokens through the backbone, attending to the prefix); this module owns the rest:
the action scaling, the denoising chain, its log-prob, the flow-matching loss.

Conventions (rectified flow): a chunk of K actions is one vector ``y`` of ``A = K x d`` entries,
scaled into [-1, 1] by the action bounds where the simulator has them. ``t = 0`` is noise,
``t = 1`` data: ``x_t = (1 - t) eps + t y``, and the network regresses the velocity ``y - eps``
(``loss``: behaviour cloning with ``rlinf sft``; ``t ~ U(0, 1)``). Acting integrates from
``x_0 ~ N(0, I)`` in N Euler steps of ``dt = 1 / N`` at ``t_k = k / N``.

RL needs a likelihood, which the deterministic ODE lacks. Each step becomes a Gaussian
transition ``x_{k+1} ~ N(mu_k, sigma_k^2)``, and the log-prob of an action chunk is the sum over
the N steps of their Gaussian log-probs given the chain ``x_0 .. x_N`` (the initial noise's own
density is left out: it does not depend on the weights). Two ways to set ``mu`` and ``sigma``:

- ``noise`` (Flow-Noise): ``mu_k = x_k + v dt`` and ``sigma_k`` from a small noise network over
  (the caller's features, ``x_k``, ``t_k``), squashed into ``[std_min, std_max]`` per entry; it
  trains with the policy (its only gradient is RL's: flow matching does not reach it).
- ``sde`` (Flow-SDE): the ODE turned into the SDE with the same marginals,
  ``dx = [v + g^2/2 * score] dt + g dW``, with the score of the linear path read off the velocity,
  ``score(x, t) = -(x - t v) / (1 - t)``, and the noise schedule of Flow-GRPO (Liu et al., 2025,
  "Flow-GRPO: Training Flow Matching Models via Online RL"; used for VLAs by piRL, Chen et al.,
  2025), ``g(t)^2 = a^2 (1 - t) / t`` in this module's time (theirs runs from data to noise).
  The ``(1 - t)`` factors cancel: ``mu_k = x_k + dt (v - a^2 / (2 t') (x_k - t_k v))``,
  ``sigma_k = a sqrt(dt (1 - t_k) / t')``, with ``t' = max(t_k, 1 / N)``: at ``t = 0`` (pure
  noise) the schedule is infinite, and like Flow-GRPO the first step takes the next grid point.

The chain is what acting records (``ActOutput.extras[CHAIN_KEY]``, [B, N + 1, A]); ``evaluate``
scores that chain under the current weights: the same computation, so the same numbers. A seed
would not do: reproducing the chain needs the weights that drew it. The entropy reported for
PPO's bonus is the sum of the steps' Gaussian entropies (the chain's, given its states), not the
action's marginal entropy, which has no closed form. ``deterministic=True`` (evaluation) runs
the ODE's steps (no injected noise, no score term) from ``x_0 ~ N(0, I)``: starting from
``x_0 = 0`` instead would land a symmetric two-mode policy between its modes, on the average an
MSE head gives. So evaluation draws only the initial noise (from torch's seeded generator).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Mapping

import torch
from torch import nn

from rlinf_cli.api import UserError

CHAIN_KEY = "flow_chain"  # the acting extra (and obs entry in training minibatches) holding the chain
NOISE_MODES = ("noise", "sde")
_LOG_SQRT_2PI = 0.5 * math.log(2 * math.pi)

# v(x_t [B, A], t [B]) -> velocity [B, A]; also v(x [B, M, A], t [B, M]) -> [B, M, A], M states of
# each row at once (``score`` with ``batch_steps``: a recorded chain's N steps are independent given
# the chain, so one network call of N x B rows can replace N calls of B; on a CPU that measured no
# faster, benchmarks/flow_steps.py; it is for accelerators, where small calls are launch-bound)
Field = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


@dataclass(frozen=True)
class FlowSettings:
    steps: int = 4  # denoising steps N per action chunk
    noise: str = "noise"  # noise (Flow-Noise: learned std per step) | sde (Flow-SDE at level sde_level)
    sde_level: float = 0.5  # Flow-SDE's noise level a
    std_min: float = 0.02  # Flow-Noise: bounds of the learned per-step std (scaled action units)
    std_max: float = 0.3
    time_dim: int = 16  # width of the sinusoidal time embedding
    noise_hidden: int = 64  # Flow-Noise: hidden width of the noise network
    batch_steps: bool = False  # score a recorded chain's N steps in one field call instead of N

    def __post_init__(self) -> None:
        if self.steps < 1:
            raise ValueError("flow_steps must be >= 1")
        if self.noise not in NOISE_MODES:
            raise ValueError(f"flow_noise must be one of {', '.join(NOISE_MODES)}, got {self.noise!r}")
        if self.sde_level <= 0 or not 0 < self.std_min < self.std_max:
            raise ValueError("flow_sde_level must be > 0 and 0 < flow_std_min < flow_std_max")
        if self.time_dim < 2 or self.time_dim % 2:
            raise ValueError("flow_time_dim must be an even number >= 2")

    @classmethod
    def from_model(cls, cfg: Any) -> "FlowSettings":
        """From a model config's ``flow_*`` fields."""
        return cls(steps=cfg.flow_steps, noise=cfg.flow_noise, sde_level=cfg.flow_sde_level,
                   std_min=cfg.flow_std_min, std_max=cfg.flow_std_max, time_dim=cfg.flow_time_dim,
                   batch_steps=cfg.flow_batch_steps)


def time_embedding(t: torch.Tensor, dim: int) -> torch.Tensor:
    """[B] times in [0, 1] -> [B, dim] sines and cosines over geometric frequencies (1 .. 100 cycles)."""
    freqs = torch.exp(torch.linspace(0.0, math.log(100.0), dim // 2, device=t.device)) * (2 * math.pi)
    arg = t.float().unsqueeze(-1) * freqs
    return torch.cat([torch.sin(arg), torch.cos(arg)], dim=-1)


class VelocityMLP(nn.Module):
    """v(features, x_t, t): an MLP over the caller's features, the noisy chunk and the time
    embedding (``model=mlp``'s action expert)."""

    def __init__(self, cond_dim: int, dim: int, hidden: tuple[int, ...], activation: type[nn.Module], time_dim: int):
        super().__init__()
        sizes = [cond_dim + dim + time_dim, *hidden, dim]
        layers: list[nn.Module] = []
        for i in range(len(sizes) - 1):
            layers.append(nn.Linear(sizes[i], sizes[i + 1]))
            if i < len(sizes) - 2:
                layers.append(activation())
        self.net = nn.Sequential(*layers)
        self.time_dim = time_dim

    def forward(self, cond: torch.Tensor, x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        w = self.net[0].weight
        if x.dim() == 3:  # M states per row (FlowHead.score): the row's features for each
            cond = cond.unsqueeze(1).expand(-1, x.shape[1], -1)
        inp = torch.cat([cond.to(w.dtype), x.to(w.dtype), time_embedding(t, self.time_dim).to(w.dtype)], dim=-1)
        return self.net(inp).float()


class FlowHead(nn.Module):
    """The denoising chain, its log-prob and the flow-matching loss over ``A``-entry chunks.

    ``cond_dim``: width of the per-row features the Flow-Noise network reads (the caller's
    observation features or the backbone's prefix state). ``low``/``high``: the bounds of one
    chunk's A entries (None: actions are used unscaled).
    """

    def __init__(self, settings: FlowSettings, dim: int, cond_dim: int,
                 low: torch.Tensor | None = None, high: torch.Tensor | None = None):
        super().__init__()
        self.s, self.dim = settings, dim
        if low is not None and high is not None:
            center, half = (high + low) / 2.0, (high - low) / 2.0
        else:
            center, half = torch.zeros(dim), torch.ones(dim)
        self.register_buffer("shift", center.float().reshape(dim), persistent=False)
        self.register_buffer("scale", half.float().reshape(dim), persistent=False)
        if settings.noise == "noise":
            h = settings.noise_hidden
            self.noise_net = nn.Sequential(nn.Linear(cond_dim + dim + settings.time_dim, h), nn.Tanh(),
                                           nn.Linear(h, dim))
            # the std starts at the middle of its bounds (log scale) for every input
            nn.init.zeros_(self.noise_net[-1].weight)
            nn.init.zeros_(self.noise_net[-1].bias)

    # -- actions <-> the flow's space ------------------------------------------------------
    def to_unit(self, action: torch.Tensor) -> torch.Tensor:
        """[B, ...] env actions of one chunk -> [B, A] in the flow's scaled space."""
        return (action.reshape(action.shape[0], -1).float() - self.shift.float()) / self.scale.float()

    def from_unit(self, y: torch.Tensor) -> torch.Tensor:
        return self.shift.float() + self.scale.float() * y  # fp32 whatever the module was cast to

    # -- one denoising step -------------------------------------------------------------------
    def transition(self, x: torch.Tensor, t: torch.Tensor, v: torch.Tensor, cond: torch.Tensor
                   ) -> tuple[torch.Tensor, torch.Tensor]:
        """Mean and log std of the next state given ``x`` at times ``t`` and the velocity there:
        x, v [B, A] with t [B] (one step), or [B, M, A] with t [B, M] (M steps of each row; cond
        [B, C] is shared by them). One formula for acting and scoring, so both give the same numbers."""
        s, dt = self.s, 1.0 / self.s.steps
        tt = t.float().unsqueeze(-1)
        if s.noise == "sde":
            t_ = tt.clamp_min(dt)  # Flow-GRPO's grid-point substitute for the singular t = 0
            a2 = s.sde_level ** 2
            mean = x + dt * (v - (a2 / 2.0) / t_ * (x - tt * v))
            log_std = (0.5 * torch.log(a2 * dt * (1.0 - tt) / t_)).expand_as(x)
            return mean, log_std
        w = self.noise_net[0].weight
        if x.dim() == 3:
            cond = cond.unsqueeze(1).expand(-1, x.shape[1], -1)
        raw = self.noise_net(torch.cat([cond.to(w.dtype), x.to(w.dtype),
                                        time_embedding(t, s.time_dim).to(w.dtype)], dim=-1)).float()
        lo, hi = math.log(s.std_min), math.log(s.std_max)
        return x + v * dt, torch.tanh(raw).add(1.0).mul(0.5 * (hi - lo)).add(lo)

    def _times(self, batch: int, k: int, device: torch.device) -> torch.Tensor:
        return torch.full((batch,), k / self.s.steps, device=device)

    # -- acting, scoring, cloning ------------------------------------------------------------
    def sample(self, field: Field, cond: torch.Tensor, deterministic: bool = False
               ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(env action [B, A], log-prob [B], chain [B, N + 1, A]) of one chunk per row.
        ``deterministic``: the ODE's steps (no injected noise), from random ``x_0``."""
        b, dev = cond.shape[0], cond.device
        x = torch.randn(b, self.dim, device=dev)
        chain, logp = [x], torch.zeros(b, device=dev)
        for k in range(self.s.steps):
            t = self._times(b, k, dev)
            v = field(x, t)
            mean, log_std = self.transition(x, t, v, cond)
            if deterministic:
                nxt = x + v / self.s.steps
            else:
                nxt = mean + torch.exp(log_std) * torch.randn_like(mean)
            logp = logp + _gauss_logp(nxt, mean, log_std)
            x = nxt
            chain.append(x)
        return self.from_unit(x), logp, torch.stack(chain, dim=1)

    def score(self, field: Field, cond: torch.Tensor, chain: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Log-prob [B] of a recorded chain under the current weights and the chain's entropy [B]
        (the sum of its steps' Gaussian entropies)."""
        chain = chain.float()
        if chain.shape[1:] != (self.s.steps + 1, self.dim):
            raise UserError(f"flow head: a recorded denoising chain has shape {tuple(chain.shape[1:])}, this model "
                            f"expects {(self.s.steps + 1, self.dim)} (model.flow_steps or the chunk changed since acting)")
        b, n = chain.shape[0], self.s.steps
        if not self.s.batch_steps:  # one field call per step, as acting makes them
            logp, entropy = torch.zeros(b, device=chain.device), torch.zeros(b, device=chain.device)
            for k in range(n):
                t = self._times(b, k, chain.device)
                mean, log_std = self.transition(chain[:, k], t, field(chain[:, k], t), cond)
                logp = logp + _gauss_logp(chain[:, k + 1], mean, log_std)
                entropy = entropy + (0.5 + _LOG_SQRT_2PI + log_std).sum(-1)
            return logp, entropy
        x = chain[:, :n]  # [B, N, A]: the states the N steps start from
        t = (torch.arange(n, device=chain.device, dtype=torch.float32) / n).expand(b, n)
        mean, log_std = self.transition(x, t, field(x, t), cond)
        logp = _gauss_logp(chain[:, 1:], mean, log_std).sum(-1)
        entropy = (0.5 + _LOG_SQRT_2PI + log_std).sum((-2, -1))
        return logp, entropy

    def loss(self, field: Field, actions: torch.Tensor) -> torch.Tensor:
        """The flow-matching loss of demonstrated chunks [B, ...]: mean squared error of the
        velocity at ``x_t = (1 - t) eps + t y``, ``t ~ U(0, 1)``, against ``y - eps``."""
        y = self.to_unit(actions)
        eps = torch.randn_like(y)
        t = torch.rand(y.shape[0], device=y.device)
        xt = (1.0 - t).unsqueeze(-1) * eps + t.unsqueeze(-1) * y
        return (field(xt, t) - (y - eps)).square().mean()


def recorded_chain(obs: Mapping[str, Any]) -> torch.Tensor:
    """The chain acting recorded for these rows; one line where there is none."""
    chain = obs.get(CHAIN_KEY)
    if chain is None:
        raise UserError(f"model.head=flow scores an action through the denoising chain that produced it "
                        f"(obs['{CHAIN_KEY}'], recorded by act); these rows have none. Behaviour cloning uses "
                        f"the flow-matching loss (algo.loss=nll); an action not drawn by this policy has no log-prob here")
    return chain


def _gauss_logp(x: torch.Tensor, mean: torch.Tensor, log_std: torch.Tensor) -> torch.Tensor:
    z = (x - mean) * torch.exp(-log_std)
    return (-0.5 * z * z - log_std - _LOG_SQRT_2PI).sum(-1)
