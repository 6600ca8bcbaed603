"""What every world's roles share: the seeds of training segments and the result of an evaluation
(the roles themselves: roles.py)."""

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
