"""Policies for a world: from a checkpoint or the model config, checked against what the world
offers, and the actors (observations -> env actions) that stages run.

:class:`EmbodiedPolicies` serves simulators (its policies act through the world's running
observation statistics and chunked envs); :class:`TextPolicies` serves text tasks (a language
model with the text methods). Both are a world's ``policies`` role
(``rlinf_cli/collectors/roles.py``: ``PolicyFactory``).
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

from rlinf_cli.api import TEXT, TEXT_SPEC, EnvSpec, Obs, Simulator
from rlinf_cli.collectors.embodied_env import EmbodiedEnv
from rlinf_cli.collectors.roles import PolicySettings
from rlinf_cli.errors import UserError
from rlinf_cli.policy import check_compatible, load_policy
from rlinf_cli.registry import get_registry
from rlinf_cli.runtime.normalize import Normalizer
from rlinf_cli.runtime import threads
from rlinf_cli.runtime.chunking import ChunkedSimulator
from rlinf_cli.runtime.rollout import policy_actor

_TEXT_METHODS = ("encode_prompts", "generate", "evaluate", "decode")


def random_actor(spec: EnvSpec, rng: np.random.Generator) -> Callable[[Obs], tuple[None, np.ndarray]]:
    return lambda obs: (None, spec.random_actions(rng, len(next(iter(obs.values())))))


def expert_actor(simulator: Simulator) -> Callable[[Obs], tuple[None, np.ndarray]]:
    expert = simulator.expert()
    if expert is None:
        raise UserError("this simulator has no scripted expert; use policy=random or a checkpoint directory")

    def act(obs: Obs) -> tuple[None, np.ndarray]:
        n = next(iter(obs.values())).shape[0]
        return None, np.stack([expert({k: v[i] for k, v in obs.items()}, i) for i in range(n)])

    return act


class EmbodiedPolicies:
    """Policies for a simulator's observations."""

    def __init__(self, env: EmbodiedEnv, settings: PolicySettings):
        self.env, self.settings = env, settings

    @property
    def normalizer(self) -> Any:
        return self.env.normalizer

    def policy(self, source: str | None, model_node: Any = None, spec: EnvSpec | None = None,
               check: bool = True) -> Any:
        """A policy loaded from checkpoint ``source`` (checked against ``spec``, by default this
        simulator's, unless ``check`` is off), or a fresh one for ``spec`` from the ``model`` config."""
        spec = spec or self.env.spec
        if source:
            policy = load_policy(source, self.settings.device)
            if check:
                check_compatible(policy, spec, f"checkpoint '{source}'")
            # a policy trained on normalized observations acts through its statistics, frozen
            self.env.normalizer = Normalizer.load(source, policy.env_spec)
            threads.fit(policy, self.settings.threads)
            return policy
        model = get_registry().get("model", model_node.name)
        if model.attrs.get("modality") == "text":
            raise UserError(f"model '{model_node.name}' is a language model; simulator '{self.env.label}' needs a "
                            f"policy for its observations (model=mlp)")
        policy = model.load()(model_node, spec).to(self.settings.device)
        threads.fit(policy, self.settings.threads)
        return policy

    def prepare_rl(self, policy: Any, fresh: bool | None = None) -> None:
        """RL from a cloned policy (``init=``): cloning shrank its action std until it barely
        explores, so it is reset, and kept fixed so PPO cannot collapse or inflate it while the
        mean improves. A resumed run keeps the std it had (``fresh=True``: prepare the init=
        policy as the run's start did, e.g. a resumed run's KL reference)."""
        s = self.settings
        fresh = bool(s.init and not s.resume) if fresh is None else fresh
        std = s.init_action_std if fresh else None
        if std is not None and std <= 0:
            raise UserError(f"init_action_std must be > 0 (or null to keep the checkpoint's), got {std}")
        learn = not s.init if s.learn_action_std is None else bool(s.learn_action_std)
        if std is not None or not learn:
            policy.set_action_std(None if std is None else float(std), trainable=learn)

    def chunk_for(self, policy: Any) -> None:
        self.env.chunk_for(policy)

    def actor(self, source: str, deterministic: bool, seed: int) -> Callable:
        """``act(obs) -> (output, env actions)`` for ``random``, ``expert`` or a checkpoint."""
        if source == "random":
            return random_actor(self.env.spec, np.random.default_rng(seed))
        if source == "expert":
            return expert_actor(self.env.sim)
        # checked against the simulator's own per-step spec: an rl run of a chunked policy has wrapped
        # it already (checkpoints/best is evaluated in the run's envs), and a chunked spec is per chunk
        sim = self.env.sim
        policy = self.policy(source, spec=(sim.inner if isinstance(sim, ChunkedSimulator) else sim).spec)
        policy.eval()
        self.chunk_for(policy)
        return self.policy_actor(policy, deterministic)

    def policy_actor(self, policy: Any, deterministic: bool) -> Callable:
        """``act`` for a policy, fed observations normalized by the current statistics (frozen)."""
        act = policy_actor(policy, self.env.spec, self.settings.device, deterministic)
        return act if self.env.normalizer is None else self.env.normalizer.actor(act)


class TextPolicies:
    """Language models for a text task."""

    normalizer = None  # text policies read token ids: no running statistics

    def __init__(self, settings: PolicySettings):
        self.settings = settings

    def policy(self, source: str | None, model_node: Any = None, spec: Any = None, check: bool = True) -> Any:
        device = self.settings.device
        if source:
            policy = load_policy(source, device)
            where = f"checkpoint '{source}'"
        else:
            if get_registry().get("model", model_node.name).attrs.get("modality") != TEXT:
                raise UserError(f"model '{model_node.name}' is not a text model; text tasks need model=hf")
            policy = get_registry().load("model", model_node.name)(model_node, TEXT_SPEC).to(device)
            where = "model"
        missing = [m for m in _TEXT_METHODS if not hasattr(policy, m)]
        if missing:
            name = getattr(policy, "config", {}).get("name", type(policy).__name__)
            raise UserError(f"{where}: model '{name}' is not a text model (it lacks {', '.join(missing)}); use model=hf")
        threads.fit(policy, self.settings.threads)
        return policy

    def prepare_rl(self, policy: Any, fresh: bool | None = None) -> None:
        pass

    def chunk_for(self, policy: Any) -> None:
        pass

    def actor(self, source: str, deterministic: bool, seed: int) -> Any:
        if source in ("random", "expert"):
            raise UserError(f"{source} is not a policy for text tasks: evaluate a model checkpoint directory "
                            f"(`rlinf collect policy=expert` writes the task's reference solutions)")
        return self.policy(source)
