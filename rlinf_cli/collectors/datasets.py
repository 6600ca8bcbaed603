"""Demonstrations in and out: episode recording for `collect`, training data for `sft`.

Both kinds of dataset give `sft` the same thing: shuffled minibatches that an algorithm's
``supervised_loss(policy, mb)`` scores, and a validation loss to pick the best checkpoint by.

- :class:`EpisodeDataset`: an rlinf parquet dataset of (observation, action) steps; validation
  holds out whole episodes.
- :class:`TextDataset`: a JSONL file of prompt/completion pairs for a language model; the loss
  is on completion tokens (+ eos) only; validation holds out rows.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import torch

from rlinf_cli.algorithm import Algorithm, MiniBatch
from rlinf_cli.api import TEXT_SPEC, Obs, StepBatch
from rlinf_cli import toolcalls
from rlinf_cli.collectors.text_sampling import pad_rows, prompt_ids, result_tokens
from rlinf_cli.data import dataset as ds, lerobot
from rlinf_cli.data.dataset import Episode
from rlinf_cli.data.jsonl import read_rows
from rlinf_cli.errors import UserError
from rlinf_cli.policy import check_compatible, obs_to_torch
from rlinf_cli.runtime.chunking import chunk_of, chunk_targets


META_SUFFIX = ".meta.json"  # beside a text JSONL: what `rlinf collect` wrote it from
# a tool's result in a transcript as `rlinf collect` writes it (the fallback format, toolcalls.result_text)
_RESULT = re.compile(re.escape(f"\n{toolcalls.RESULT_OPEN}") + "(.*?)" + re.escape(f"{toolcalls.RESULT_CLOSE}\n"),
                     re.DOTALL)


def read_meta(path: str) -> dict[str, Any]:
    """Provenance written beside a JSONL by `rlinf collect` (``<file>.meta.json``); {} if absent."""
    meta = Path(str(path) + META_SUFFIX)
    if not meta.is_file():
        return {}
    try:
        return json.loads(meta.read_text())
    except ValueError as exc:
        raise UserError(f"'{meta}' is not valid JSON ({exc}); delete or fix it") from exc


class EpisodeBuffer:
    """Records each env's steps while its episode runs (a recorder for run_episodes)."""

    def __init__(self, n: int):
        self.steps: list[list[tuple[Obs, np.ndarray, float, bool]]] = [[] for _ in range(n)]
        self.ended: list[tuple[bool, bool] | None] = [None] * n

    def __call__(self, t: int, obs: Obs, out: Any, action: np.ndarray, sb: StepBatch, alive: np.ndarray) -> None:
        for i in np.flatnonzero(alive):
            self.steps[i].append(({k: v[i] if v.dtype == object else v[i].copy() for k, v in obs.items()},
                                  np.asarray(action[i]).copy(),
                                  float(sb.reward[i]), bool(sb.success[i])))
            if sb.terminated[i] or sb.truncated[i]:
                self.ended[i] = (bool(sb.terminated[i]), bool(sb.truncated[i]))

    def episode(self, i: int, seed: int) -> Episode:
        steps = self.steps[i]
        term, trunc = self.ended[i] or (False, True)
        return Episode(
            obs={k: np.stack([s[0][k] for s in steps]) for k in steps[0][0]},
            actions=np.stack([s[1] for s in steps]),
            rewards=np.array([s[2] for s in steps], dtype=np.float32),
            success=np.array([s[3] for s in steps], dtype=bool),
            terminated=term, truncated=trunc, seed=seed,
        )


def with_noise(act: Any, spec: Any, noise: float, epsilon: float, rng: np.random.Generator) -> Any:
    """Diverse demonstrations: Gaussian noise on continuous actions, random actions with prob. epsilon."""
    if noise <= 0 and epsilon <= 0:
        return act

    def noisy(obs: Obs) -> tuple[Any, np.ndarray]:
        out, a = act(obs)
        a = np.array(a, copy=True)
        if noise > 0 and not spec.discrete:
            a = a + rng.normal(0.0, noise, size=a.shape).astype(np.float32)
            if spec.action.low is not None:
                a = np.clip(a, spec.action.low, spec.action.high)
        if epsilon > 0:
            swap = rng.random(a.shape[0]) < epsilon
            if swap.any():  # draw only then, so noisy collects stay reproducible across versions
                a[swap] = spec.random_actions(rng, a.shape[0])[swap]
        return out, a

    return noisy


def split_episodes(episode_ids: np.ndarray, val_fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Row masks (train, val), holding out whole episodes so validation sees unseen trajectories."""
    unique = np.unique(episode_ids)
    val = np.isin(episode_ids, np.random.default_rng(seed).permutation(unique)[:_n_val(len(unique), val_fraction)])
    return ~val, val


def _n_val(n: int, val_fraction: float) -> int:
    """How many of ``n`` episodes or examples validation holds out (none of a single one)."""
    return int(math.ceil(val_fraction * n)) if n >= 2 and val_fraction > 0 else 0


class EpisodeDataset:
    """(observation, action) steps of an rlinf dataset, for behaviour cloning."""

    def __init__(self, path: str, val_fraction: float, seed: int, device: Any, lerobot_features: Any = None):
        if lerobot.is_lerobot_dataset(path):  # a LeRobot v3.0 directory: features mapped onto observation keys
            self.data = lerobot.load(path, dict(lerobot_features or {}))
            self.meta_file = self.data.path / lerobot.INFO
        else:
            self.data = ds.load(path)
            self.meta_file = self.data.path / ds.META
        self.spec = self.data.spec
        train_rows, val_rows = split_episodes(self.data.episode, val_fraction, seed)
        self.obs = obs_to_torch(self.data.obs, device)
        self.actions = torch.as_tensor(self.data.actions, device=device)
        self.train_idx = torch.from_numpy(np.flatnonzero(train_rows))
        self.val_idx = torch.from_numpy(np.flatnonzero(val_rows))
        self.generator = torch.Generator().manual_seed(seed)
        self.normalizer: Any = None  # see normalize_with

    def normalize_with(self, normalizer: Any) -> None:
        """:meth:`sample` hands out observations as a run that normalizes them (``env.normalize_obs``)
        feeds its policy: through ``normalizer``'s statistics at the time of the draw, never
        updating them (the demonstrations are not the run's experience)."""
        self.normalizer = normalizer if normalizer is not None and normalizer.keys else None

    def prepare(self, policy: Any, note: Any) -> None:
        """The policy must read what the dataset holds (a LeRobot dataset says which features map where)."""
        if self.data.meta.get("format") == "lerobot":
            lerobot.check_keys(policy.observation_keys, self.data, self.data.path)
        check_compatible(policy, self.spec, f"the policy for dataset '{self.data.path}'")
        k = chunk_of(policy)
        if k > 1:  # a policy that acts in chunks clones each step's next k actions
            self.actions = torch.as_tensor(chunk_targets(np.asarray(self.data.actions), np.asarray(self.data.episode), k),
                                           device=self.actions.device)

    def _batch(self, idx: torch.Tensor) -> MiniBatch:
        return MiniBatch(None, None, None, None, obs={k: v[idx] for k, v in self.obs.items()}, actions=self.actions[idx])

    def steps_per_epoch(self, size: int) -> int:
        return math.ceil(len(self.train_idx) / max(1, min(size, len(self.train_idx))))

    def minibatches(self, size: int) -> Iterator[MiniBatch]:
        mb = max(1, min(size, len(self.train_idx)))
        perm = self.train_idx[torch.randperm(len(self.train_idx), generator=self.generator)]
        for start in range(0, len(perm), mb):
            yield self._batch(perm[start:start + mb])

    def sample(self, size: int, generator: torch.Generator) -> MiniBatch:
        """``size`` training steps drawn uniformly (with replacement) by ``generator``: the
        demonstrations beside on-policy RL (rl demos=), drawn from the run's own generator so a
        resumed run draws what the uninterrupted one would."""
        batch = self._batch(self.train_idx[torch.randint(len(self.train_idx), (size,), generator=generator)])
        if self.normalizer is not None:
            raw = {k: batch.obs[k].cpu().numpy() for k in self.normalizer.keys}
            seen = self.normalizer.observe(raw, update=False)
            batch.obs.update({k: torch.as_tensor(seen[k], device=batch.obs[k].device) for k in self.normalizer.keys})
        return batch

    @torch.no_grad()
    def val_loss(self, policy: Any, algo: Algorithm) -> float | None:
        return float(algo.supervised_loss(policy, self._batch(self.val_idx))) if len(self.val_idx) else None

    def metrics(self, seconds: float) -> dict[str, float]:
        return {}

    def describe(self) -> dict[str, Any]:
        return {"train_samples": int(len(self.train_idx)), "val_samples": int(len(self.val_idx))}


def read_pairs(path: str, prompt_key: str, completion_key: str) -> list[tuple[str, str]]:
    rows = read_rows(path, (prompt_key, completion_key), "dataset", "set text.prompt_key / text.completion_key", strings=True)
    return [(row[prompt_key], row[completion_key]) for row in rows]


class TextDataset:
    """Prompt/completion pairs for a language model (``text.*`` settings of `sft`).

    Prompts are encoded as the policy encodes them for RL (chat template when the tokenizer has
    one), the completion is followed by eos, and the loss is on completion tokens only. A file
    that `rlinf collect` wrote from a task with tools names them in its provenance: the prompts
    describe them as in RL, and each tool result of a transcript is rendered as the policy renders
    tool turns and gets no loss (the model is taught to call, not to make up results).
    """

    def __init__(self, path: str, val_fraction: float, seed: int, device: Any, text_cfg: Any):
        self.t = text_cfg
        self.pairs = read_pairs(path, str(text_cfg.prompt_key), str(text_cfg.completion_key))
        self.val_fraction, self.device = val_fraction, device
        self.rng = np.random.default_rng(seed)
        self.meta_file = None
        self.tokens = 0
        self.spec = TEXT_SPEC
        self.tools = list((read_meta(path).get("provenance") or [{}])[-1].get("tools") or [])

    def prepare(self, policy: Any, note: Any) -> None:
        """Encode with the policy's tokenizer, drop rows longer than ``text.max_length``, split, pack."""
        self.pad = policy.pad_token_id
        max_length = int(self.t.max_length)
        prompts = prompt_ids(policy, [p for p, _ in self.pairs], self.tools)
        self.rows, self.masks, self.dropped = [], [], 0
        for prompt, (_, completion) in zip(prompts, self.pairs):
            target, loss = self._completion(policy, completion)
            if len(prompt) + len(target) > max_length:
                self.dropped += 1
                continue
            self.rows.append(list(prompt) + target)
            self.masks.append([0] * len(prompt) + loss)
        if not self.rows:
            raise UserError(f"every example is longer than text.max_length={max_length} tokens; raise it")
        if self.dropped:
            note(f"dropped {self.dropped} examples longer than text.max_length={max_length} tokens")
        order = self.rng.permutation(len(self.rows))
        n_val = _n_val(len(self.rows), self.val_fraction)
        self.val_idx, train_idx = order[:n_val], order[n_val:]
        self.n_train = len(train_idx)
        self.train_rows = [self.rows[i] for i in train_idx]
        self.train_masks = [self.masks[i] for i in train_idx]
        if self.t.packing:
            self.train_rows, self.train_masks = pack(self.train_rows, self.train_masks, max_length)

    def _completion(self, policy: Any, text: str) -> tuple[list[int], list[int]]:
        """A completion's tokens (+ eos) and loss mask: 0 on tool results where the data has tools."""
        if not self.tools:
            ids = policy.encode_text(text) + [policy.eos_token_id]
            return ids, [1] * len(ids)
        ids, mask, at = [], [], 0
        for m in _RESULT.finditer(text):
            wrote = policy.encode_text(text[at:m.start()])
            call = toolcalls.parse_call(text[at:m.start()])
            result = result_tokens(policy, call.name if call else "", m.group(1), False)
            ids += wrote + result
            mask += [1] * len(wrote) + [0] * len(result)
            at = m.end()
        tail = policy.encode_text(text[at:]) + [policy.eos_token_id]
        return ids + tail, mask + [1] * len(tail)

    def _batch(self, rows: list[list[int]], masks: list[list[int]]) -> MiniBatch:
        ids, attn, loss = collate(rows, masks, self.pad, self.device)
        self.tokens += int(attn.sum())
        return MiniBatch(None, None, None, None, mask=loss[:, 1:], obs={"input_ids": ids, "attention_mask": attn})

    def steps_per_epoch(self, size: int) -> int:
        return math.ceil(len(self.train_rows) / max(1, min(size, len(self.train_rows))))

    def minibatches(self, size: int) -> Iterator[MiniBatch]:
        mb = max(1, min(size, len(self.train_rows)))
        perm = self.rng.permutation(len(self.train_rows))
        for s in range(0, len(perm), mb):
            idx = perm[s:s + mb]
            yield self._batch([self.train_rows[i] for i in idx], [self.train_masks[i] for i in idx])

    @torch.no_grad()
    def val_loss(self, policy: Any, algo: Algorithm) -> float | None:
        if not len(self.val_idx):
            return None
        total = 0.0
        for s in range(0, len(self.val_idx), 256):
            idx = self.val_idx[s:s + 256]
            tokens = self.tokens
            total += float(algo.supervised_loss(policy, self._batch([self.rows[i] for i in idx],
                                                                    [self.masks[i] for i in idx]))) * len(idx)
            self.tokens = tokens  # validation tokens are not training throughput
        return total / len(self.val_idx)

    def metrics(self, seconds: float) -> dict[str, float]:
        return {"time/tokens_per_s": self.tokens / max(seconds, 1e-9)}

    def describe(self) -> dict[str, Any]:
        return {"train_examples": int(self.n_train), "val_examples": int(len(self.val_idx)), "dropped": self.dropped}


def pack(rows: list[list[int]], masks: list[list[int]], max_length: int) -> tuple[list[list[int]], list[list[int]]]:
    """Greedy packing: consecutive examples share a row up to ``max_length`` tokens."""
    out_rows: list[list[int]] = []
    out_masks: list[list[int]] = []
    for r, m in zip(rows, masks):
        if out_rows and len(out_rows[-1]) + len(r) <= max_length:  # fits beside the examples before it
            out_rows[-1] += r
            out_masks[-1] += m
        else:
            out_rows.append(list(r))
            out_masks.append(list(m))
    return out_rows, out_masks


def collate(rows: list[list[int]], masks: list[list[int]], pad: int, device: Any) -> tuple[Any, Any, Any]:
    ids, attn, loss = pad_rows(rows, pad), pad_rows([[1] * len(r) for r in rows]), pad_rows(masks)  # masks fit rows
    return ids.to(device), attn.to(device), loss.to(device)

