"""The roles a world plays for the stages, each a small protocol, and the settings each receives.

A stage never branches on the modality: :func:`rlinf_cli.collectors.make` builds a :class:`World`
once (from the simulator's registration or the dataset's kind) whose roles are

- ``policies`` (:class:`PolicyFactory`, ``rlinf_cli/policy_factory.py``): policies from a
  checkpoint or the model config, checked against this world; actors for random / expert;
- ``rollout`` (:class:`Rollout`): collects :class:`~rlinf_cli.experience.Experience` for `rl`,
  with the arrays a checkpoint keeps to continue exactly, its metrics and budget;
- ``batches`` (:class:`~rlinf_cli.runtime.batches.Batches`, in the runtime): how the update cuts
  an experience into minibatches or samples the replay buffer the rollout fills;
- ``evaluator`` (:class:`Evaluator`): held-out episodes or prompts -> :class:`Evaluation`, tables;
- ``recorder`` (:class:`Recorder`): datasets for `sft`, demonstrations for `collect`.

Modalities differ only in which set they plug in (``collectors/embodied_*.py`` for simulators,
``collectors/text_*.py`` for text tasks). Each role gets its settings dataclass below, built from
the config in one place (``collectors/__init__.py``: ``settings``), never the whole config.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Protocol, Sequence

import numpy as np

from rlinf_cli.collectors.base import Evaluation

if TYPE_CHECKING:  # the runtime's batches import torch; these protocols stay light
    from rlinf_cli.runtime.batches import Batches


# -- settings ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class PolicySettings:
    device: Any
    init: str | None = None  # the checkpoint an `rl` run starts from
    resume: str | None = None
    init_action_std: float | None = None
    learn_action_std: bool | None = None
    threads: Any = "auto"  # train.threads: fitted to the policy once it is built (runtime/threads.py)


@dataclass(frozen=True)
class EnvSettings:
    """Where a simulator's envs run: the executor and its transport (embodied worlds)."""

    executor: dict[str, Any] | None  # the executor node (``name`` and its options)
    runtime: dict[str, Any]  # ``runtime.*`` plus ``env``'s transport options, for the executor
    device: Any = "cpu"


@dataclass(frozen=True)
class RolloutSettings:
    seed: int = 0
    num_envs: int = 8
    total_steps: int | None = None  # embodied budget (env steps)
    iterations: int | None = None  # text budget (``text.iterations``)
    max_new_tokens: int | None = None  # ``text.max_new_tokens`` (None: the task's)
    init: str | None = None
    demos: str | None = None  # an rlinf dataset seeding the replay buffer
    normalize: dict[str, Any] | None = None  # the ``env`` node (normalize_obs, clip_obs, ...)
    overlap_update: bool = False
    progress: bool = True
    generation: Any = None  # placement.generation (runtime/generation.py: GenerationPlacement); None = none
    max_staleness: int = 0  # runtime.max_staleness: weight versions a generation worker's samples may lag


@dataclass(frozen=True)
class EvalSettings:
    num_envs: int = 8
    max_new_tokens: int | None = None


@dataclass(frozen=True)
class RecordSettings:
    seed: int = 0
    num_envs: int = 8
    deterministic: bool = True
    action_noise: float = 0.0
    epsilon: float = 0.0
    format: str = "rlinf"  # rlinf | lerobot
    lerobot: dict[str, Any] | None = None  # ``lerobot.*`` (codec, fps, features, ...)
    sim_name: str | None = None
    samples: int = 1  # text: completions per prompt
    max_new_tokens: int | None = None
    text: Any = None  # the ``text`` node: a text dataset's keys and lengths


@dataclass(frozen=True)
class RoleSettings:
    """Every role's settings, read from the config once (``collectors.settings``)."""

    policy: PolicySettings
    env: EnvSettings
    rollout: RolloutSettings
    eval: EvalSettings
    record: RecordSettings


# -- roles ---------------------------------------------------------------------------------------
class PolicyFactory(Protocol):
    normalizer: Any  # running observation statistics of the loaded checkpoint (embodied), or None

    def policy(self, source: str | None, model_node: Any = None, spec: Any = None, check: bool = True) -> Any:
        """A policy from checkpoint ``source``, or a fresh one from ``model_node``."""
        ...

    def prepare_rl(self, policy: Any, fresh: bool | None = None) -> None:
        """Ready ``policy`` for RL (a cloned policy's action std)."""
        ...

    def chunk_for(self, policy: Any) -> None:
        """Fit the world to a policy that acts in chunks of K actions."""
        ...

    def actor(self, source: str, deterministic: bool, seed: int) -> Any:
        """What acts for ``random``, ``expert`` or a checkpoint."""
        ...


class Rollout(Protocol):
    unit: str  # what the budget counts: "steps" or "iterations"

    def budget(self) -> int: ...

    def units(self, state: dict[str, Any]) -> float: ...

    def start(self, policy: Any, algo: Any, rank: int, world: int, state: dict[str, Any],
              saved: dict[str, np.ndarray] | None) -> list[str]:
        """Prepare collection, continuing from the arrays ``state()`` saved; returns notes."""
        ...

    def collect(self, policy: Any, algo: Any, iteration: int) -> Any:
        """One rollout: an :class:`~rlinf_cli.experience.Experience`."""
        ...

    def logprobs(self, policy: Any, exp: Any) -> Any:
        """A (reference) policy's log-probs of the experience's actions."""
        ...

    def metrics(self, exp: Any, seconds: float) -> dict[str, float]: ...

    def info(self, metrics: dict[str, float]) -> str: ...

    def state(self) -> dict[str, np.ndarray]:
        """The arrays a checkpoint needs to continue exactly (names kept across versions)."""
        ...

    def save_files(self, directory: Any) -> None: ...

    def close(self) -> None: ...


class Evaluator(Protocol):
    def evaluate(self, policy: Any, episodes: int, seed: int, deterministic: bool = True, label: str = "policy",
                 on_batch: Callable[[int], None] | None = None, **options: Any) -> Evaluation: ...

    def table(self, rows: dict[str, dict[str, float]], title: str,
              instructions: dict[str, str] | None = None) -> Any:
        """A rich table of ``rows``; ``instructions``: what each row's episodes were told."""
        ...

    def check_video(self, video: int, size: int) -> None: ...


class Recorder(Protocol):
    def dataset(self, path: str, val_fraction: float, seed: int) -> Any: ...

    def writer(self, output: str, provenance: dict[str, Any], chunk: int) -> Any: ...

    def record(self, writer: Any, source: str, want: int, only_success: bool, progress: Any) -> list[Any]: ...

    def demos_summary(self, kept: Sequence[Any]) -> dict[str, float]: ...


@dataclass
class World:
    """What a stage's policy acts in: one set of roles, for one modality."""

    modality: str  # "embodied" | "text"
    policies: PolicyFactory
    rollout: Rollout
    batches: Batches
    evaluator: Evaluator
    recorder: Recorder
    _spec: Callable[[], Any]  # built on first use: a dataset's simulator need not be installed
    _label: Callable[[], str]

    @property
    def spec(self) -> Any:
        return self._spec()

    @property
    def label(self) -> str:
        return self._label()

    @property
    def unit(self) -> str:
        return self.rollout.unit

    def close(self) -> None:
        self.rollout.close()
