"""The Collector protocol: everything a stage needs from "the world" its policy acts in.

A stage never branches on the modality: it asks a collector (``rlinf_cli.collectors.make``
picks it once, from the simulator's registration or the dataset's kind). Both collectors
(``embodied.EmbodiedCollector``: simulator envs placed by an executor; ``text.TextCollector``:
a language model's completions scored by a task) provide:

- ``policy(source, model_node, spec, check)``, ``prepare_rl(policy, cfg)``: a policy from a
  checkpoint or the model config, checked against this world;
- ``budget(cfg)``, ``units(state)``, ``unit``: the size of an `rl` run and what it counts;
- ``start(policy, algo, rank, world, state, saved)``: prepare collection (continue from the
  arrays ``state()`` saved), returns notes; ``collect(policy, algo, iteration) -> Experience``;
  ``epochs(exp, adv, ret, algo, generator)``: one iterable of minibatches per epoch;
  ``logprobs(policy, exp)``: a reference policy's log-probs; ``metrics(exp, seconds)``, ``info(metrics)``;
- ``evaluate(policy, episodes, seed, ...) -> Evaluation``, ``table(rows, title)``,
  ``check_video(n, size)``;
- ``dataset(path, val_fraction, seed)`` for `sft`; ``writer(...)``, ``record(...)``,
  ``demos_summary(kept)`` for `collect`; ``close()``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np


def training_seeds(seed: int, key: int, n: int) -> list[int]:
    """Seeds for training segment ``key``: a deterministic hash, kept below the eval range."""
    state = np.random.SeedSequence([int(seed), int(key)]).generate_state(n)
    return [int(s) % 1_000_000 for s in state]


@dataclass
class Evaluation:
    """A policy's held-out results: a summary, rows for a table, metrics for tracking, and extra
    JSON for ``result.json`` (per task, per episode, example completions)."""

    summary: dict[str, float]
    rows: dict[str, dict[str, float]]
    metrics: dict[str, float]
    extra: dict[str, Any] = field(default_factory=dict)
    examples: Any = None  # a rich table of examples (text), printed after the results table
