"""The one data currency: what every rollout produces and every algorithm learns from.

Samples are laid out ``[T, N]``: T steps (time) of N columns. An embodied steps rollout has T
steps of N envs; a group rollout has one column per episode (masked after it ends), groups of
``group_size`` columns side by side; a text rollout has T = 1 and one column per completion,
with a token dimension: ``logprobs`` and ``token_mask`` are then ``[T, N, L]``, and ``values`` too
where the algorithm uses a critic (the value before each token; each step's ``rewards``, ``dones``
and ``trunc_values`` then belong to its last policy token: rlinf_algos/ppo.py's GAE). Algorithms read
the documented tensors; ``obs`` and ``actions`` belong to the rollout and the policy
(``policy.evaluate(mb.obs, mb.actions)``), so an algorithm never depends on the modality.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch


@dataclass
class Experience:
    obs: Any  # rollout-defined: dict of [T, N, ...] tensors (embodied), prompts (text)
    actions: Any  # [T, N, *action_shape] (embodied), completion tokens (text)
    logprobs: torch.Tensor  # [T, N] (or [T, N, L] per token) at collection time
    values: torch.Tensor  # [T, N] critic values at collection time (zeros without a critic); text: [T, N, L]
    rewards: torch.Tensor  # [T, N]
    dones: torch.Tensor  # [T, N] 1.0 where an episode ended at this step
    trunc_values: torch.Tensor  # [T, N] V(final obs) where an episode was truncated (bootstrap), else 0
    mask: torch.Tensor  # [T, N] 1.0 for steps inside an episode
    last_value: torch.Tensor  # [N] V(obs after the last step), for bootstrapping
    episode_returns: torch.Tensor | None = None  # [N] group rollouts: the return of each column's episode
    group_size: int = 1  # columns per group, groups side by side (1: no groups)
    token_mask: torch.Tensor | None = None  # [T, N, L] tokens the policy wrote (text)
    ref_logprobs: torch.Tensor | None = None  # like logprobs, from a frozen reference policy
    episodes: list[Any] = field(default_factory=list)  # EpisodeStats of episodes that ended here
    env_steps: int = 0  # env steps (or completions) in this experience
    stats: dict[str, float] = field(default_factory=dict)  # rollout diagnostics (transport, timing)
