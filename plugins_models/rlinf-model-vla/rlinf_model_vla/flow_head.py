"""model=vla model.head=flow: the pi0 pattern on rlinf's VLA.

K action tokens follow the prefix (``<bos> instruction | image | proprio``); each is the noisy
action ``x_t[k]`` projected to the backbone's width plus an embedding of the flow time ``t``.
The backbone runs them against the prefix's keys and values (computed once per act or evaluate,
through the instruction cache where it applies, ``model.prefix_cache``), so the actions attend to
the prefix, and their hidden states, through one linear layer, are the velocity of the K
actions. Every denoising step is one backbone call of K tokens; the prefix's cache is cut back
to the prefix after each. With ``model.flow_batch_steps`` scoring a recorded chain (``evaluate``)
runs its N steps as one call of N x B rows instead, each with its row's prefix (the steps are
independent given the chain). The chain, its log-prob, Flow-Noise and Flow-SDE are
rlinf-model-mlp's shared ``flow.py``; the noise network reads the prefix's last hidden state.

The backbone is a causal LM, so action token k attends to the prefix and to action tokens
``1 .. k`` (pi0 lets its action tokens attend to each other both ways: a difference).
"""

from __future__ import annotations

from typing import Any, Callable

import torch
from torch import nn

from rlinf_model_mlp.flow import time_embedding


class FlowTokens(nn.Module):
    """The action expert's own parameters, used through module calls (DeepSpeed ZeRO-3 gathers a
    module's parameters for its call): the action-in projection, the time MLP and the velocity out."""

    def __init__(self, k: int, dims: int, hidden: int, time_dim: int):
        super().__init__()
        self.time_dim = time_dim
        self.action_in = nn.Linear(dims, hidden)
        self.time_in = nn.Sequential(nn.Linear(time_dim, hidden), nn.SiLU(), nn.Linear(hidden, hidden))
        # one learned offset per position in the chunk (the backbone's positions tell them apart too)
        self.position = nn.Parameter(torch.randn(1, k, hidden) * 0.02)
        self.velocity_out = nn.Linear(hidden, dims)

    def forward(self, x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        """Noisy actions [B, K, d] at times [B] -> token embeddings [B, K, hidden]."""
        w = self.action_in.weight
        temb = self.time_in(time_embedding(t, self.time_dim).to(w.dtype))
        return self.action_in(x.to(w.dtype)) + temb.unsqueeze(1) + self.position

    def velocity(self, h: torch.Tensor) -> torch.Tensor:
        return self.velocity_out(h).float()


def flow_field(policy: Any, obs: Any) -> tuple[Callable[[torch.Tensor, torch.Tensor], torch.Tensor], torch.Tensor,
                                                 torch.Tensor]:
    """(velocity field over flat chunks [B, K x d], the prefix's last hidden state [B, H] in fp32
    (what the noise network reads), the value [B]) for ``obs``: the prefix runs once."""
    from transformers import DynamicCache

    h, attn, pos, past = policy._forward(obs, keep_cache=True)
    prefix = [(entry[0], entry[1]) for entry in past]  # per layer (keys, values) of the prefix
    b, k = h.shape[0], policy.action_chunk
    attn_k = torch.cat([attn, attn.new_ones((b, k))], dim=1)
    pos_k = pos + torch.arange(1, k + 1, device=pos.device)

    def field(x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        # x [B, A] (one step) or [B, M, A] (M steps of each row, FlowHead.score): the M states
        # become M batch rows per row, each against its own row's prefix, in one backbone call
        m = x.shape[1] if x.dim() == 3 else 1
        # a fresh cache over the prefix's tensors each call: the backbone appends this call's
        # tokens to it (new tensors), never to the prefix, so the next call sees the prefix alone
        cache = DynamicCache()
        for layer, (key, value) in enumerate(prefix):
            if m > 1:
                key, value = key.repeat_interleave(m, dim=0), value.repeat_interleave(m, dim=0)
            cache.update(key, value, layer)
        tokens = policy.flow_tokens(x.reshape(b * m, k, policy.dims), t.reshape(b * m))
        rows = (lambda z: z.repeat_interleave(m, dim=0)) if m > 1 else (lambda z: z)
        hk, _ = policy._backbone(tokens, rows(attn_k), cache, rows(pos_k))
        v = policy.flow_tokens.velocity(hk)
        return v.reshape(b, m, -1) if x.dim() == 3 else v.reshape(b, -1)

    last = h[:, 0]
    return field, last.float(), policy._value(last)
