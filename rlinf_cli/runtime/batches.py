"""Batches: how the update reads an experience, so that it never calls back into a rollout.

On-policy algorithms learn from epochs of shuffled minibatches of the experience just collected;
off-policy ones from batches sampled out of a replay buffer. The two layouts:

- :class:`SampleBatches` (embodied worlds): every valid ``[T, N]`` sample is one row, shuffled per
  epoch; off-policy, batches are drawn from the :class:`ReplayStore` the rollout fills.
- :class:`GroupBatches` (text worlds): whole groups of completions per minibatch (a language
  model encodes a group's prompt once).

Both build :class:`~rlinf_cli.algorithm.MiniBatch` by field name. ``runtime/update.py`` receives
one of these; the RNG draws (one ``randperm`` per epoch, the replay buffer's draws) are those the
collectors made before the split, in the same order.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable, Iterator, Protocol

import numpy as np
import torch

from rlinf_cli.algorithm import Algorithm, MiniBatch, TransitionBatch
from rlinf_cli.experience import Experience
from rlinf_cli.policy import obs_to_torch


class OnPolicyBatches(Protocol):
    def epochs(self, exp: Experience, adv: torch.Tensor, ret: torch.Tensor, algo: Algorithm,
               generator: torch.Generator) -> Iterator[Iterable[MiniBatch]]:
        """One iterable of minibatches per epoch."""
        ...


class ReplayBatches(Protocol):
    def collected(self) -> int:
        """Transitions added to the replay buffer so far (restored on resume)."""
        ...

    def sample(self, algo: Algorithm, generator: torch.Generator) -> TransitionBatch:
        """One batch of transitions for one gradient step."""
        ...


class Batches(OnPolicyBatches, ReplayBatches, Protocol):
    """What :func:`rlinf_cli.runtime.update.update` reads: either side, as the algorithm learns."""


@dataclass
class ReplayStore:
    """The off-policy rollout's buffers, filled when it starts; the update samples from them."""

    replay: Any = None  # runtime.replay.ReplayBuffer of this rank's transitions
    demos: Any = None  # a ReplayBuffer of demonstrations (rl demos=...), never overwritten
    normalizer: Any = None  # the run's running statistics (sampled batches are normalized)
    batch_size: int = 0
    demo_fraction: float = 0.0


class SampleBatches:
    """Flat samples: shuffled epochs on-policy, replay batches off-policy (embodied worlds)."""

    def __init__(self, device: Any = "cpu", store: ReplayStore | None = None):
        self.device = device
        self.store = store if store is not None else ReplayStore()

    def epochs(self, exp: Experience, adv: torch.Tensor, ret: torch.Tensor, algo: Algorithm,
               generator: torch.Generator) -> Iterator[Iterable[MiniBatch]]:
        """One iterable of minibatches per epoch: the valid samples, shuffled. One gather per
        tensor per epoch, then contiguous slices (cheap at thousands of tiny steps)."""
        obs, actions, data = flatten(exp, adv, ret)
        n = actions.shape[0]
        size = min(algo.minibatch_size, n)

        def epoch() -> Iterator[MiniBatch]:
            perm = torch.randperm(n, generator=generator)
            e_obs = {k: v[perm.numpy()] if isinstance(v, np.ndarray) else v[perm] for k, v in obs.items()}
            e_actions = actions[perm]
            e_data = {name: None if t is None else t[perm] for name, t in data.items()}
            for start in range(0, n, size):
                sl = slice(start, start + size)
                yield MiniBatch(**{name: None if t is None else t[sl] for name, t in e_data.items()},
                                obs={k: v[sl] for k, v in e_obs.items()}, actions=e_actions[sl])

        for _ in range(algo.epochs if n else 0):
            yield epoch()

    def collected(self) -> int:
        return int(self.store.replay.added)

    def sample(self, algo: Algorithm, generator: torch.Generator) -> TransitionBatch:
        """``batch_size`` transitions, ``demo_fraction`` of them from the demonstrations (RLPD's
        symmetric sampling), normalized by the current statistics."""
        s = self.store
        n_demo = int(round(s.batch_size * s.demo_fraction)) if s.demos is not None else 0
        parts = [s.replay.sample(s.batch_size - n_demo, generator)]
        if n_demo:
            parts.append(s.demos.sample(n_demo, generator))
        cat = (lambda key: np.concatenate([p[key] for p in parts])) if n_demo else (lambda key: parts[0][key])
        obs = {k: np.concatenate([p["obs"][k] for p in parts]) for k in parts[0]["obs"]}
        nxt = {k: np.concatenate([p["next_obs"][k] for p in parts]) for k in parts[0]["next_obs"]}
        rewards = cat("rewards")
        if s.normalizer is not None:
            obs, nxt = s.normalizer.observe(obs, update=False), s.normalizer.observe(nxt, update=False)
            rewards = s.normalizer.scale_rewards(rewards)
        dev = self.device
        demo = (np.arange(s.batch_size) >= s.batch_size - n_demo).astype(np.float32)  # the last n_demo rows
        f = lambda x: torch.as_tensor(np.asarray(x, np.float32), device=dev)  # noqa: E731
        return TransitionBatch(obs=obs_to_torch(obs, dev), actions=torch.as_tensor(cat("actions"), device=dev),
                               rewards=f(rewards), next_obs=obs_to_torch(nxt, dev), terminated=f(cat("terminated")),
                               demo=f(demo))


def flatten(exp: Experience, adv: torch.Tensor, ret: torch.Tensor
            ) -> tuple[dict[str, Any], Any, dict[str, torch.Tensor | None]]:
    """``[T, N, ...]`` -> ``[B, ...]`` rows of the valid samples: (obs, actions, MiniBatch fields)."""
    valid = exp.mask.reshape(-1) > 0
    keep_all = bool(valid.all())

    def flat(x: Any) -> Any:
        if x is None:
            return None
        x = x.reshape(-1, *x.shape[2:])
        if keep_all:
            return x
        return x[valid.cpu().numpy()] if isinstance(x, np.ndarray) else x[valid]  # text entries: numpy

    data = {"old_logprob": flat(exp.logprobs), "advantages": flat(adv), "returns": flat(ret),
            "old_values": flat(exp.values), "mask": None, "ref_logprob": flat(exp.ref_logprobs)}
    return {k: flat(v) for k, v in exp.obs.items()}, flat(exp.actions), data


class GroupBatches:
    """Minibatches of whole groups (``minibatch_size`` completions, rounded down to groups):
    a language model encodes a group's prompt once (text worlds)."""

    def epochs(self, exp: Experience, adv: torch.Tensor, ret: torch.Tensor, algo: Algorithm,
               generator: torch.Generator) -> Iterator[Iterable[MiniBatch]]:
        G = exp.group_size
        B = exp.rewards.numel()
        if not B:  # every group was dropped: nothing to learn from
            return
        n_groups = B // G
        per_mb = max(1, min(n_groups, algo.minibatch_size // G))
        loss_mask = exp.token_mask.reshape(B, -1)
        old = exp.logprobs.reshape(B, -1)
        # outcome advantages are per episode ([T, N]: every token of it shares one); a critic's GAE
        # gives advantages, returns and values per token ([T, N, L]: [B, L] minibatches, zero off the
        # policy's tokens); episode-level returns and values stay [B] as the loss reads them
        adv_tok = (adv.reshape(B, -1) if adv.dim() == 3 else adv.reshape(B, 1)) * loss_mask
        ret = ret.reshape(B, -1) * loss_mask if ret.dim() == 3 else ret.reshape(B)
        values = exp.values.reshape(B, -1) * loss_mask if exp.values.dim() == 3 else exp.values.reshape(B)
        ref = None if exp.ref_logprobs is None else exp.ref_logprobs.reshape(B, -1)
        obs, act = exp.obs, exp.actions

        def epoch() -> Iterator[MiniBatch]:
            perm = torch.randperm(n_groups, generator=generator)
            for start in range(0, n_groups, per_mb):
                g = perm[start:start + per_mb]
                rows = (g.unsqueeze(1) * G + torch.arange(G)).reshape(-1).to(adv_tok.device)
                yield MiniBatch(old_logprob=old[rows], advantages=adv_tok[rows], returns=ret[rows],
                                old_values=values[rows], mask=loss_mask[rows],
                                ref_logprob=None if ref is None else ref[rows],
                                obs={k: v[g.to(v.device)] for k, v in obs.items()},
                                actions={k: v[rows] for k, v in act.items()})

        for _ in range(algo.epochs):
            yield epoch()

    def collected(self) -> int:
        raise NotImplementedError("text worlds have no replay buffer (their rollout refuses rollout='transitions')")

    def sample(self, algo: Algorithm, generator: torch.Generator) -> TransitionBatch:
        raise NotImplementedError("text worlds have no replay buffer (their rollout refuses rollout='transitions')")
