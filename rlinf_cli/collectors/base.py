"""The Collector protocol: everything a stage needs from "the world" its policy acts in.

A stage never branches on the modality: it asks a collector (``rlinf_cli.collectors.make``
picks it once, from the simulator's registration or the dataset's kind) for policies,
experience, minibatches, evaluations, datasets and demonstrations. The embodied collector
drives simulator envs placed by an executor; the text collector samples completions of a
language model and scores them with a task's verifiable reward.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Iterator, Protocol

import numpy as np
import torch

from rlinf_cli.algorithm import Algorithm, MiniBatch
from rlinf_cli.experience import Experience


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


class Collector(Protocol):
    modality: str  # "embodied" | "text"
    unit: str  # what `rl`'s budget counts ("steps", "iterations")
    label: str  # the simulator or task, for titles

    def policy(self, source: str | None, model_node: Any = None) -> Any:
        """A policy from checkpoint ``source`` (checked against this world) or fresh from ``model_node``."""

    def prepare_rl(self, policy: Any, cfg: Any) -> None:
        """Adjust a policy before RL (exploration noise of a cloned policy, ...)."""

    def budget(self, cfg: Any) -> tuple[int, int]:
        """``(total units, ...)`` of an `rl` run."""

    def units(self, state: dict[str, Any]) -> float:
        """Units of the budget a run's progress state has used."""

    def start(self, policy: Any, algo: Algorithm, rank: int, world: int, state: dict[str, Any],
              saved: dict[str, np.ndarray] | None) -> list[str]:
        """Prepare collection (continue from ``saved``, the arrays :meth:`state` returned); notes to show."""

    def collect(self, policy: Any, algo: Algorithm, iteration: int) -> Experience: ...

    def epochs(self, exp: Experience, adv: torch.Tensor, ret: torch.Tensor, algo: Algorithm,
               generator: torch.Generator) -> Iterator[Iterable[MiniBatch]]:
        """One iterable of minibatches per epoch, each evaluable by ``policy.evaluate(mb.obs, mb.actions)``."""

    def logprobs(self, policy: Any, exp: Experience) -> torch.Tensor:
        """Another policy's log-probs of the experience's actions (a frozen reference)."""

    def metrics(self, exp: Experience) -> dict[str, float]: ...

    def info(self, metrics: dict[str, float]) -> str:
        """A few words for the progress line."""

    def state(self) -> dict[str, np.ndarray]:
        """Arrays a checkpoint needs to continue collection exactly."""

    def evaluate(self, policy: Any, episodes: int, seed: int, deterministic: bool = True, label: str = "policy",
                 on_batch: Callable[[int], None] | None = None) -> Evaluation: ...

    def table(self, rows: dict[str, dict[str, float]], title: str) -> Any: ...

    def dataset(self, path: str, val_fraction: float, seed: int) -> Any:
        """Demonstrations for `sft` (see ``rlinf_cli.collectors.datasets``)."""

    def close(self) -> None: ...
