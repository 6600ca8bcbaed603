"""MLP actor-critic, with a small CNN encoder for image observations.

Observation keys listed in ``obs_keys`` are encoded and concatenated: flat vectors as they are,
images (``[H, W, C]`` uint8) through a CNN shared by actor and critic. For a simulator with
several tasks (``EnvSpec.tasks``), the task id it observes is embedded and appended, so one
network learns all tasks. Discrete actions
use a categorical head; continuous actions a Gaussian with a state-independent log std, or, with
``squash: true`` (SAC), a tanh-squashed Gaussian with a state-dependent std whose samples are
scaled into the action bounds. ``q_heads: K`` adds K action-value heads Q(s, a) with Polyak
target copies and the entropy temperature (the off-policy interface of rlinf_cli/policy.py).
``head: flow`` replaces the Gaussian with a flow-matching action expert over chunks of ``chunk``
actions (flow.py: the velocity MLP, the denoising chain and its log-prob, shared with model=vla).
Distributions are written out by hand: ``torch.distributions`` validation and object creation
cost more than the maths at these sizes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from rlinf_cli.api import (settings, TASK_KEY, EnvSpec, UserError, ActOutput, EvalOutput, Policy, fp32_matmuls,
                           onednn_bf16_active)

from . import fast_grad
from .fast_act import FastActor
from .flow import CHAIN_KEY, FlowHead, FlowSettings, VelocityMLP, recorded_chain
from .fast_act import supported as fast_act_supported

_LOG_SQRT_2PI = 0.5 * math.log(2 * math.pi)
_ACTIVATIONS = {"tanh": nn.Tanh, "relu": nn.ReLU, "gelu": nn.GELU, "elu": nn.ELU}
_FUNCTIONS = {"tanh": torch.tanh, "relu": torch.relu, "gelu": F.gelu, "elu": F.elu}
# In place on a layer's fresh output, which nothing has saved for backward (tanh's and relu's
# backward read their result, which stays intact): one allocation fewer per layer, 3-4% of a SAC
# gradient step at 256x256 (benchmarks/sac_step.py's harness, paired blocks).
_IN_PLACE = {"tanh": torch.tanh_, "relu": torch.relu_}


@dataclass(frozen=True)
class MLPConfig:
    hidden_sizes: tuple[int, ...] = (64, 64)  # hidden layer widths of actor and critic
    activation: str = "tanh"  # tanh | relu | gelu | elu
    obs_keys: tuple[str, ...] = ("state",)  # observation entries to concatenate
    log_std_init: float = 0.0  # initial log std of the Gaussian (continuous actions)
    critic: bool = True  # build a value head (PPO needs it; GRPO and BC do not)
    ortho_init: bool = True  # orthogonal init with small policy-head gain
    cnn_channels: tuple[int, ...] = (16, 32)  # conv channels for image observations
    cnn_kernels: tuple[int, ...] = (8, 4)  # conv kernel sizes
    cnn_strides: tuple[int, ...] = (4, 2)  # conv strides
    cnn_features: int = 128  # encoder output width per image
    task_embedding: int = 16  # width of the learned task embedding for multi-task simulators; 0 = none
    squash: bool = False  # continuous actions: tanh-squashed Gaussian with a state-dependent std (SAC)
    log_std_min: float = -5.0  # squash: bounds of the state-dependent log std
    log_std_max: float = 2.0
    q_heads: int = 0  # action-value heads Q(s, a) (SAC: 2); each has a Polyak-averaged target copy
    init_temperature: float = 1.0  # q_heads > 0: initial entropy temperature (alpha), learned by SAC
    fast_act: bool = True  # act on small CPU batches in numpy (the same maths, a fraction of torch's dispatch)
    fast_grad: bool = True  # Gaussian evaluate as one autograd node with a hand-written backward (fast_grad.py)
    head: str = "gaussian"  # continuous actions: gaussian | flow (a flow-matching action expert, flow.py)
    chunk: int = 1  # head=flow: env actions per policy step (K), denoised together
    flow_steps: int = 4  # head=flow: denoising steps N per chunk
    flow_noise: str = "noise"  # head=flow: noise (Flow-Noise: learned std per step) | sde (Flow-SDE)
    flow_sde_level: float = 0.5  # flow_noise=sde: noise level a
    flow_std_min: float = 0.02  # flow_noise=noise: bounds of the learned per-step std (scaled units)
    flow_std_max: float = 0.3
    flow_time_dim: int = 16  # head=flow: width of the time embedding
    flow_batch_steps: bool = False  # head=flow: score a chain's N steps in one call (accelerators; no faster on CPU)
    residual: bool = False  # the Gaussian's mean is a frozen base policy's plus this actor's (residual RL; rl init_residual=true)

    def __post_init__(self) -> None:
        if self.activation not in _ACTIVATIONS:
            raise ValueError(f"activation must be one of {sorted(_ACTIVATIONS)}, got {self.activation!r}")
        if not self.hidden_sizes or any(h < 1 for h in self.hidden_sizes):
            raise ValueError("hidden_sizes must be a non-empty list of positive widths")
        if not len(self.cnn_channels) == len(self.cnn_kernels) == len(self.cnn_strides):
            raise ValueError("cnn_channels, cnn_kernels and cnn_strides must have the same length")
        if self.q_heads < 0 or self.init_temperature <= 0 or self.log_std_min >= self.log_std_max:
            raise ValueError("q_heads must be >= 0, init_temperature > 0 and log_std_min < log_std_max")
        if self.head not in ("gaussian", "flow"):
            raise ValueError(f"head must be gaussian or flow, got {self.head!r}")
        if self.chunk < 1 or (self.chunk > 1 and self.head != "flow"):
            raise ValueError("chunk must be >= 1, and > 1 only with head=flow")
        if self.head == "flow":
            FlowSettings.from_model(self)  # validates the flow_* keys
        if self.residual and (self.head != "gaussian" or self.squash or self.q_heads):
            raise ValueError("residual is for the Gaussian head, without squash or q_heads")


class CNNEncoder(nn.Module):
    """[B, H, W, C] uint8 image -> [B, features]; conv + ReLU stack, then a linear layer."""

    def __init__(self, shape: tuple[int, ...], cfg: MLPConfig):
        super().__init__()
        h, w, c = shape
        layers: list[nn.Module] = []
        for out_c, k, s in zip(cfg.cnn_channels, cfg.cnn_kernels, cfg.cnn_strides):
            layers += [nn.Conv2d(c, out_c, k, s), nn.ReLU()]
            c = out_c
        self.conv = nn.Sequential(*layers, nn.Flatten())
        with torch.no_grad():
            n = self.conv(torch.zeros(1, shape[2], h, w)).shape[1]
        self.out = nn.Sequential(nn.Linear(n, cfg.cnn_features), nn.ReLU())

    def forward(self, img: torch.Tensor) -> torch.Tensor:
        x = img.permute(0, 3, 1, 2).float().mul_(1.0 / 255.0)
        return self.out(self.conv(x))


def mlp(sizes: list[int], activation: type[nn.Module], out_gain: float, ortho: bool) -> nn.Sequential:
    layers: list[nn.Module] = []
    for i in range(len(sizes) - 1):
        linear = nn.Linear(sizes[i], sizes[i + 1])
        last = i == len(sizes) - 2
        if ortho:
            nn.init.orthogonal_(linear.weight, out_gain if last else math.sqrt(2))
            nn.init.zeros_(linear.bias)
        layers.append(linear)
        if not last:
            layers.append(activation())
    return nn.Sequential(*layers)


class MLPPolicy(Policy):
    def __init__(self, config: Mapping[str, Any], env_spec: EnvSpec):
        super().__init__(config, env_spec)
        cfg = settings.build(MLPConfig, config, "model")
        self.cfg = cfg
        missing = [k for k in cfg.obs_keys if k not in env_spec.observation]
        if missing:
            raise UserError(f"model.obs_keys {list(cfg.obs_keys)}: the simulator has no {missing}; it gives {sorted(env_spec.observation)}")
        self._images = [k for k in cfg.obs_keys if len(env_spec.observation[k].shape) == 3]
        # the task id is a category, not a number: embedded (whether or not obs_keys lists it)
        self._embed_task = cfg.task_embedding > 0 and len(env_spec.tasks) > 1 and TASK_KEY in env_spec.observation
        self._flat = [k for k in cfg.obs_keys if k not in self._images and not (self._embed_task and k == TASK_KEY)]
        self.encoders = nn.ModuleDict({k: CNNEncoder(tuple(env_spec.observation[k].shape), cfg) for k in self._images})
        in_dim = sum(math.prod(env_spec.observation[k].shape) for k in self._flat) + cfg.cnn_features * len(self._images)
        if self._embed_task:
            self.task_embed = nn.Embedding(len(env_spec.tasks), cfg.task_embedding)
            in_dim += cfg.task_embedding
        act = _ACTIVATIONS[cfg.activation]
        hidden = list(cfg.hidden_sizes)
        self.squash = cfg.squash and not env_spec.discrete
        if (cfg.squash or cfg.q_heads) and env_spec.discrete:
            raise UserError("model.squash and model.q_heads are for continuous actions; this simulator's are discrete")
        if env_spec.discrete:
            out_dim = int(env_spec.num_actions)
        else:
            out_dim = math.prod(env_spec.action.shape)
            if not self.squash and cfg.head != "flow":
                self.log_std = nn.Parameter(torch.full((out_dim,), float(cfg.log_std_init)))
        self._act_dim = out_dim
        self.flow: FlowHead | None = None
        if cfg.head == "flow":
            if env_spec.discrete or cfg.squash or cfg.q_heads:
                raise UserError("model.head=flow is for continuous actions, without model.squash or model.q_heads (SAC)")
            self._init_flow(cfg, env_spec, in_dim, out_dim, act)
        # squash: mean and log std per dimension; bounds map tanh's (-1, 1) onto [low, high]
        if self.flow is None:
            self.actor = mlp([in_dim, *hidden, 2 * out_dim if self.squash else out_dim], act, 0.01, cfg.ortho_init)
        if self.squash or cfg.q_heads:
            low = env_spec.action.low if env_spec.action.low is not None else -1.0
            high = env_spec.action.high if env_spec.action.high is not None else 1.0
            self.register_buffer("_center", torch.full((out_dim,), (high + low) / 2.0), persistent=False)
            self.register_buffer("_half", torch.full((out_dim,), (high - low) / 2.0), persistent=False)
            # actions into (-1, 1) as one fused multiply-add (a - center) / half = a * inv + shift
            self.register_buffer("_inv_half", 1.0 / self._half, persistent=False)
            self.register_buffer("_shift", -self._center / self._half, persistent=False)
            # the squashed log-prob's constant part: - d log(sqrt(2 pi)) - 2 d log 2 - sum log half
            self._logp_const = -out_dim * (_LOG_SQRT_2PI + 2.0 * math.log(2.0)) - float(torch.log(self._half).sum())
        self.has_q = cfg.q_heads > 0
        if self.has_q:
            self.q = nn.ModuleList(mlp([in_dim + out_dim, *hidden, 1], act, 1.0, cfg.ortho_init) for _ in range(cfg.q_heads))
            self.q_target = nn.ModuleList(mlp([in_dim + out_dim, *hidden, 1], act, 1.0, cfg.ortho_init)
                                          for _ in range(cfg.q_heads))
            self.q_target.load_state_dict(self.q.state_dict())
            self.q_target.requires_grad_(False)
            self.log_alpha = nn.Parameter(torch.tensor(math.log(cfg.init_temperature)))
        self.has_critic = cfg.critic
        if cfg.critic:
            self.critic = mlp([in_dim, *hidden, 1], act, 1.0, cfg.ortho_init)
        self._keys = cfg.obs_keys
        # Linear layers in order, for the functional forward below. Module calls cost more than
        # the maths at these sizes (PPO runs thousands of minibatches); the ops are identical.
        self._fn = _IN_PLACE.get(cfg.activation, _FUNCTIONS[cfg.activation])
        self._actor_layers = [m for m in self.actor if isinstance(m, nn.Linear)] if self.flow is None else []
        self._critic_layers = [m for m in self.critic if isinstance(m, nn.Linear)] if cfg.critic else []
        if self.has_q:
            self._q_layers = [[m for m in q if isinstance(m, nn.Linear)] for q in self.q]
            self._q_target_layers = [[m for m in q if isinstance(m, nn.Linear)] for q in self.q_target]
        gaussian = self.flow is None
        self._fast_act = FastActor(self) if gaussian and cfg.fast_act and fast_act_supported(self) else None
        self._fast_grad = gaussian and cfg.fast_grad and fast_grad.supported(self)
        self.base: MLPPolicy | None = None
        if cfg.residual:
            if env_spec.discrete:
                raise UserError("model.residual is for continuous actions; this simulator's are discrete")
            # the clone's actor (and its encoders), frozen; no critic: the value is this policy's
            self.base = MLPPolicy({**self.config, "residual": False, "critic": False}, env_spec).requires_grad_(False)

    def _init_flow(self, cfg: MLPConfig, env_spec: EnvSpec, in_dim: int, out_dim: int, act: type[nn.Module]) -> None:
        """The flow-matching action expert over chunks of ``cfg.chunk`` actions (flow.py)."""
        flow = FlowSettings.from_model(cfg)
        self.action_chunk = cfg.chunk  # read by the runtime (rlinf_cli.runtime.chunking) when > 1
        self._chunk_shape = ((cfg.chunk,) if cfg.chunk > 1 else ()) + tuple(env_spec.action.shape)
        dim = cfg.chunk * out_dim
        a = env_spec.action
        bounds = [None, None]
        if a.low is not None and a.high is not None:
            bounds = [torch.tensor(np.broadcast_to(np.asarray(b, np.float32), a.shape)).reshape(-1).repeat(cfg.chunk)
                      for b in (a.low, a.high)]
        self.flow = FlowHead(flow, dim, in_dim, *bounds)
        self.velocity = VelocityMLP(in_dim, dim, tuple(cfg.hidden_sizes), act, flow.time_dim)

    def _field(self, x: torch.Tensor) -> Any:
        return lambda xt, t: self.velocity(x, xt, t)

    @property
    def observation_keys(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys([*self._keys, *([TASK_KEY] if self._embed_task else [])]))

    # -- the layout the fast paths (fast_act.py, fast_grad.py) compute with, read-only ------------
    @property
    def actor_layers(self) -> list[nn.Linear]:
        """The actor MLP's linear layers in order, its output layer last (the live modules)."""
        return self._actor_layers

    @property
    def critic_layers(self) -> list[nn.Linear]:
        """The value MLP's linear layers in order (empty without a critic)."""
        return self._critic_layers

    @property
    def flat_keys(self) -> tuple[str, ...]:
        """The observation keys flattened and concatenated, in this order, into the features."""
        return tuple(self._flat)

    @property
    def flat_features_only(self) -> bool:
        """Whether the features are the flat keys alone (no image encoder, no task embedding)."""
        return not self._images and not self._embed_task

    @property
    def action_dim(self) -> int:
        """Width of the actor's mean (its output is twice as wide with a state-dependent std)."""
        return self._act_dim

    @property
    def action_scale(self) -> tuple[torch.Tensor, torch.Tensor]:
        """``(center, half_range)`` of the action bounds: a squashed action is
        ``center + half_range * tanh(u)`` (only with ``squash`` or Q heads)."""
        return self._center, self._half

    def critic_parameters(self) -> list[nn.Parameter]:
        # the value MLP alone: the CNN encoders and the task embedding feed the actor too
        return list(self.critic.parameters()) if self.has_critic else []

    def _run(self, layers: list[nn.Linear], x: torch.Tensor, detach: bool = False) -> torch.Tensor:
        """``nn.Sequential`` forward of an :func:`mlp` without per-module call overhead;
        ``detach``: through detached weights (gradients reach the input, not the layers).

        Under ``train.bf16`` the output layer's product stays fp32: its outputs (Q values, means,
        log stds, logits, values) feed log-probs, targets and losses, where bf16's 8-bit mantissa
        would round a Q value of 300 to steps of 2. In the engine's oneDNN form (CPU) the first
        layer's product stays fp32 too (raw observations keep their digits); at those shapes (input
        14 or output 1 by 256 rows) oneDNN's bf16 mode is also 2-6x slower than fp32 (measured)."""
        if hasattr(layers[0].weight, "ds_id"):  # DeepSpeed ZeRO-3 gathers weights in module hooks
            return (self.actor if layers is self._actor_layers else self.critic)(x)
        exact_ends = x.dtype == torch.float32 and x.device.type == "cpu" and onednn_bf16_active()
        last = len(layers) - 1
        for i, lin in enumerate(layers):
            w, b = (lin.weight.detach(), lin.bias.detach()) if detach else (lin.weight, lin.bias)
            if exact_ends and (i == 0 or i == last):
                with fp32_matmuls():
                    x = F.linear(x, w, b)
            elif i == last and x.dtype != torch.float32 and torch.is_autocast_enabled(x.device.type):
                with torch.autocast(x.device.type, enabled=False):
                    x = F.linear(x.float(), w, b)
            else:
                x = F.linear(x, w, b)
            if i < last:
                x = self._fn(x)
        return x

    def features(self, obs: dict[str, torch.Tensor]) -> torch.Tensor:
        if len(self._flat) == 1 and not self._images and not self._embed_task:
            x = obs[self._flat[0]]
            return x.reshape(x.shape[0], -1).float()
        parts = [obs[k].reshape(obs[k].shape[0], -1).float() for k in self._flat]
        parts += [self.encoders[k](obs[k]) for k in self._images]
        if self._embed_task:
            parts.append(self.task_embed(obs[TASK_KEY].reshape(-1).long()))
        return torch.cat(parts, dim=-1)

    def _value(self, x: torch.Tensor) -> torch.Tensor:
        return self._run(self._critic_layers, x).squeeze(-1) if self.has_critic else x.new_zeros(x.shape[0])

    def get_value(self, obs: dict[str, torch.Tensor]) -> torch.Tensor:
        return self._value(self.features(obs))

    def mean_action(self, obs: dict[str, torch.Tensor]) -> torch.Tensor:
        if self.flow is not None:
            raise UserError("model.head=flow has no mean action to regress: clone it with algo.loss=nll "
                            "(the default; the flow-matching loss for this head)")
        out = self._run(self._actor_layers, self.features(obs))
        if self.squash:
            return self._center + self._half * torch.tanh(out[..., :self._act_dim])
        base = self._base_mean(obs)
        return out if base is None else out + base

    # -- squashed Gaussian and Q heads (off-policy algorithms: SAC) -----------------------------
    def _squashed(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        out = self._run(self._actor_layers, x)
        mean, log_std = out[..., :self._act_dim], out[..., self._act_dim:]
        lo, hi = self.cfg.log_std_min, self.cfg.log_std_max
        # smooth bounds lo + (hi - lo) (tanh + 1) / 2; add_ on the product's fresh output
        return mean, torch.tanh(log_std).mul(0.5 * (hi - lo)).add_(lo + 0.5 * (hi - lo))

    def _squash_logp(self, u: torch.Tensor, mean: torch.Tensor, log_std: torch.Tensor,
                     z_sq: torch.Tensor | None = None) -> torch.Tensor:
        """log-prob of the action tanh(u), scaled into the bounds: Gaussian log-prob of u minus
        log|d action / d u|, with log(1 - tanh(u)^2) = 2 (log 2 - u - softplus(-2u)) (numerically
        stable) and the constants folded into one number. ``z_sq``: sum of ((u - mean) / std)^2
        where the caller knows it without gradient (a sample: the noise it drew), which halves
        the autograd nodes (SAC samples twice per gradient step; at its sizes each node's
        dispatch costs more than its arithmetic)."""
        if z_sq is None:
            z_sq = ((u - mean) * torch.exp(-log_std)).square().sum(-1)
        return (u + F.softplus(u * -2.0)).sum(-1).mul(2.0).sub_(log_std.sum(-1)).add_(
            z_sq.mul(-0.5).add_(self._logp_const))

    def sample(self, obs: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        """A reparameterised action sample (differentiable) and its log-prob [B] (squash only)."""
        mean, log_std = self._squashed(self.features(obs))
        noise = torch.randn_like(mean)
        u = torch.addcmul(mean, log_std.exp(), noise)
        with torch.no_grad():
            z_sq = noise.square().sum(-1)  # ((u - mean) / std)^2, which the noise equals
        return torch.addcmul(self._center, self._half, torch.tanh(u)), self._squash_logp(u, mean, log_std, z_sq)

    def q_values(self, obs: dict[str, torch.Tensor], action: torch.Tensor, target: bool = False,
                 detach: bool = False) -> torch.Tensor:
        """Q(s, a) of every head, [K, B]; ``action`` in the env's units. ``target``: the Polyak
        copies; ``detach``: gradients reach the action but not the heads (the actor's loss)."""
        x = torch.cat([self.features(obs), torch.addcmul(self._shift, action.float(), self._inv_half)], dim=-1)
        heads = self._q_target_layers if target else self._q_layers
        return torch.stack([self._run(layers, x, detach=detach).squeeze(-1) for layers in heads])

    @torch.no_grad()
    def update_targets(self, tau: float) -> None:
        """Polyak averaging: target <- (1 - tau) target + tau online."""
        # read off the cached Linear layers: walking the module tree with .parameters() every
        # gradient step cost ~0.2 ms of SAC's ~10 ms step (cProfile)
        target = [t for layers in self._q_target_layers for lin in layers for t in (lin.weight, lin.bias)]
        online = [t for layers in self._q_layers for lin in layers for t in (lin.weight, lin.bias)]
        torch._foreach_lerp_(target, online, tau)

    def set_action_std(self, std: float | None, trainable: bool = True) -> bool:
        if self.env_spec.discrete or self.squash or self.flow is not None:
            return False
        if std is not None:
            with torch.no_grad():
                self.log_std.fill_(math.log(std))
        self.log_std.requires_grad_(trainable)
        return True

    def residual(self) -> "MLPPolicy | None":
        if self.env_spec.discrete or self.squash or self.flow is not None or self.has_q:
            return None
        if self.base is not None:
            raise UserError("this checkpoint already learns a residual on a frozen clone: continue it with resume=, "
                            "or start from it with init_residual=false")
        policy = MLPPolicy({**self.config, "residual": True}, self.env_spec).to(self.log_std.device)
        own = self.state_dict()
        policy.base.load_state_dict({k: own[k] for k in policy.base.state_dict()})
        # the critic, the std and the clone's features carry over; the correction's hidden layers are
        # fresh and its output layer zero, so the policy starts as exactly the clone
        policy.load_state_dict({k: v for k, v in own.items() if not k.startswith("actor.")}, strict=False)
        with torch.no_grad():
            policy.actor_layers[-1].weight.zero_()
            policy.actor_layers[-1].bias.zero_()
        return policy

    def _base_mean(self, obs: dict[str, torch.Tensor]) -> torch.Tensor | None:
        """The frozen base's deterministic action (residual RL), without gradient; None without one."""
        if self.base is None:
            return None
        with torch.no_grad():
            fast = self.base._fast_act(obs, True) if self.base._fast_act is not None else None
            return fast[0] if fast is not None else self.base.mean_action(obs)

    def act(self, obs: dict[str, torch.Tensor], deterministic: bool = False) -> ActOutput:
        if self.flow is not None:
            x = self.features(obs)
            action, logp, chain = self.flow.sample(self._field(x), x, deterministic)
            return ActOutput(action.view(x.shape[0], *self._chunk_shape), logp, self._value(x), {CHAIN_KEY: chain})
        base = self._base_mean(obs)
        if self._fast_act is not None:
            fast = self._fast_act(obs, deterministic)
            if fast is not None:
                return ActOutput(*fast) if base is None else ActOutput(fast[0] + base, *fast[1:])
        x = self.features(obs)
        out = self._run(self._actor_layers, x)
        if base is not None:
            out = out + base
        if self.env_spec.discrete:
            logp_all = torch.log_softmax(out, dim=-1)
            if deterministic:
                action = out.argmax(dim=-1)
            else:
                action = torch.multinomial(logp_all.exp(), 1).squeeze(-1)
            logp = logp_all.gather(-1, action.unsqueeze(-1)).squeeze(-1)
        elif self.squash:
            mean, log_std = out[..., :self._act_dim], out[..., self._act_dim:]
            lo, hi = self.cfg.log_std_min, self.cfg.log_std_max
            log_std = lo + 0.5 * (hi - lo) * (torch.tanh(log_std) + 1.0)
            u = mean if deterministic else mean + log_std.exp() * torch.randn_like(mean)
            action = self._center + self._half * torch.tanh(u)
            logp = self._squash_logp(u, mean, log_std)
        else:
            std = self.log_std.exp()
            action = out if deterministic else out + std * torch.randn_like(out)
            logp = self._gauss_logp(action, out)
        return ActOutput(action, logp, self._value(x))

    def evaluate(self, obs: dict[str, torch.Tensor], action: torch.Tensor) -> EvalOutput:
        x = self.features(obs)
        if self.flow is not None:  # the recorded chain's log-prob (the action is its last state)
            logp, entropy = self.flow.score(self._field(x), x, recorded_chain(obs))
            return EvalOutput(logp, entropy, self._value(x))
        base = self._base_mean(obs)
        if base is not None:  # the log-prob of base + correction is the correction's, of the action less the base
            action = action - base
        if self._fast_grad and fast_grad.applies(self, x, action):
            logp, value = fast_grad.evaluate(self, x, action)
            return EvalOutput(logp, (0.5 + _LOG_SQRT_2PI + self.log_std).sum().expand(x.shape[0]), value)
        out = self._run(self._actor_layers, x)
        if self.env_spec.discrete:
            logp_all = torch.log_softmax(out, dim=-1)
            logp = logp_all.gather(-1, action.long().unsqueeze(-1)).squeeze(-1)
            entropy = -(logp_all.exp() * logp_all).sum(-1)
        elif self.squash:
            mean, log_std = self._squashed(x)
            y = ((action.float() - self._center) / self._half).clamp(-1 + 1e-6, 1 - 1e-6)
            logp = self._squash_logp(torch.atanh(y), mean, log_std)
            entropy = -logp.detach()  # no closed form under the squash: a one-sample estimate
        else:
            logp = self._gauss_logp(action, out)
            entropy = (0.5 + _LOG_SQRT_2PI + self.log_std).sum().expand(x.shape[0])
        return EvalOutput(logp, entropy, self._value(x))

    def imitation_loss(self, obs: dict[str, torch.Tensor], actions: torch.Tensor) -> torch.Tensor | None:
        if self.flow is None:
            return None
        x = self.features(obs)
        return self.flow.loss(self._field(x), actions)

    def _gauss_logp(self, action: torch.Tensor, mean: torch.Tensor) -> torch.Tensor:
        z = (action - mean) * torch.exp(-self.log_std)
        return (-0.5 * z * z - self.log_std - _LOG_SQRT_2PI).sum(-1)
