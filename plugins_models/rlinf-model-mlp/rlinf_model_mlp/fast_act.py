"""Acting on small CPU batches in numpy, on the live weights of an :class:`MLPPolicy`.

A rollout asks the policy for one action per env per step: 8 envs of a 64x64 MLP is a few
thousand multiply-adds, and torch's per-op dispatch (~25 ops: two networks, sampling, the
log-prob) costs several times the maths. The same forward in numpy costs a fraction of that
(``benchmarks/fast_act.py``). This is the rollout side of the rollout/training split: the
trainer keeps torch and autograd; acting reads the same parameter storage through numpy views,
so an optimizer step or a ``load_state_dict`` is seen at once. When a parameter's storage is
replaced (the flat-buffer optimizer's first step, ``.to()``), the views are rebuilt.

Random draws still come from torch's generator (``torch.randn`` of the same shape as
``randn_like`` in the torch path, ``torch.multinomial`` on the same probabilities), so a seeded
run draws the same numbers in either path and checkpoints keep their RNG state. The results agree
with the torch path to float32 rounding (``tests/unit/test_fast_act.py``).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Callable

import numpy as np
import torch

if TYPE_CHECKING:
    from .model import MLPPolicy

# numpy acts while rows x (widest hidden layer)^2 stays under this: past it torch's matmul kernels
# beat numpy's BLAS by more than the dispatch saved (benchmarks/fast_act.py: at 64x64 numpy is 1.6x
# faster at 64 rows and even at 256; at 256x256 2.4x at 1-4 rows, slower from 8)
MAX_WORK = 64 * 64 * 64
_LOG_SQRT_2PI = 0.5 * math.log(2 * math.pi)
_LOG2 = math.log(2.0)

_FUNCTIONS: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "tanh": np.tanh,
    "relu": lambda x: np.maximum(x, 0.0, out=x),
}


def supported(policy: "MLPPolicy") -> bool:
    """Whether ``policy``'s act can run here: flat float observations only (no image encoder or
    task embedding) and an activation with an exact numpy counterpart."""
    return policy.flat_features_only and policy.cfg.activation in _FUNCTIONS


class FastActor:
    """``act`` of an :class:`MLPPolicy` in numpy; ``__call__`` returns None where it does not apply."""

    def __init__(self, policy: "MLPPolicy"):
        self.policy = policy
        self.fn = _FUNCTIONS[policy.cfg.activation]
        self.max_rows = max(1, MAX_WORK // max(policy.cfg.hidden_sizes) ** 2)
        self.keys, self.act_dim = policy.flat_keys, policy.action_dim
        self.tensors = [t for lin in [*policy.actor_layers, *policy.critic_layers] for t in (lin.weight, lin.bias)]
        if hasattr(policy, "log_std"):
            self.tensors.append(policy.log_std)
        self.ptrs: list[int] = []
        self.actor: list[tuple[np.ndarray, np.ndarray]] = []
        self.critic: list[tuple[np.ndarray, np.ndarray]] = []
        self.log_std: np.ndarray | None = None
        self.center = self.half = None
        if policy.squash:
            center, half = policy.action_scale
            self.center, self.half = center.numpy(), half.numpy()

    def _views(self) -> bool:
        """(Re)build the numpy views when a parameter's storage moved; False if they cannot be numpy."""
        ptrs = [t.data_ptr() for t in self.tensors]
        if ptrs == self.ptrs:
            return True
        if any(t.device.type != "cpu" or t.dtype != torch.float32 or hasattr(t, "ds_id") for t in self.tensors):
            return False
        p = self.policy

        def views(layers: list[torch.nn.Linear]) -> list[tuple[np.ndarray, np.ndarray]]:
            # W.T is a strided view: numpy hands it to BLAS as a transposed operand, no copy
            return [(lin.weight.detach().numpy().T, lin.bias.detach().numpy()) for lin in layers]

        self.actor, self.critic = views(p.actor_layers), views(p.critic_layers)
        self.log_std = p.log_std.detach().numpy() if hasattr(p, "log_std") else None
        self.ptrs = ptrs
        return True

    def _forward(self, layers: list[tuple[np.ndarray, np.ndarray]], x: np.ndarray) -> np.ndarray:
        for w, b in layers[:-1]:
            x = self.fn(x @ w + b)
        w, b = layers[-1]
        return x @ w + b

    def __call__(self, obs: dict[str, torch.Tensor], deterministic: bool) -> tuple[torch.Tensor, ...] | None:
        p = self.policy
        parts = [obs[k] for k in self.keys]
        if torch.is_grad_enabled() or any(t.device.type != "cpu" for t in parts) \
                or parts[0].shape[0] > self.max_rows or torch.is_autocast_enabled("cpu") or not self._views():
            return None
        arrays = [t.numpy().reshape(t.shape[0], -1) for t in parts]
        x = (arrays[0] if len(arrays) == 1 else np.concatenate(arrays, axis=1)).astype(np.float32, copy=False)
        out = self._forward(self.actor, x)
        n = x.shape[0]
        if p.env_spec.discrete:
            shifted = out - out.max(axis=-1, keepdims=True)
            logp_all = shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))
            if deterministic:
                action = out.argmax(axis=-1)
            else:
                action = torch.multinomial(torch.from_numpy(np.exp(logp_all)), 1).squeeze(-1).numpy()
            logp = np.take_along_axis(logp_all, action[:, None], axis=-1)[:, 0]
            action = action.astype(np.int64, copy=False)
        elif p.squash:
            d = self.act_dim
            mean, raw = out[:, :d], out[:, d:]
            lo, hi = p.cfg.log_std_min, p.cfg.log_std_max
            log_std = lo + 0.5 * (hi - lo) * (np.tanh(raw) + 1.0)
            u = mean if deterministic else mean + np.exp(log_std) * torch.randn(mean.shape).numpy()
            action = self.center + self.half * np.tanh(u)
            z = (u - mean) * np.exp(-log_std)
            gauss = (-0.5 * z * z - log_std - _LOG_SQRT_2PI).sum(-1)
            # log(1 - tanh(u)^2) in its stable form; softplus(y) = logaddexp(0, y)
            jac = 2.0 * (_LOG2 - u - np.logaddexp(0.0, -2.0 * u)) + np.log(self.half)
            logp = gauss - jac.sum(-1)
        else:
            log_std = self.log_std
            action = out if deterministic else out + np.exp(log_std) * torch.randn(out.shape).numpy()
            z = (action - out) * np.exp(-log_std)
            logp = (-0.5 * z * z - log_std - _LOG_SQRT_2PI).sum(-1)
        value = self._forward(self.critic, x)[:, 0] if p.has_critic else np.zeros(n, np.float32)
        return torch.from_numpy(action), torch.from_numpy(logp), torch.from_numpy(value)
