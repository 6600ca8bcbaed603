"""The policy interface every model plugin implements, and its save/load plumbing.

A policy maps a dict of observation tensors (leading batch dim) to an action distribution and,
when it has a critic, a value. Checkpoints are ``model.safetensors`` + ``config.json``: no
pickle, so a checkpoint from someone else cannot run code on load.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any, Mapping, NamedTuple

import torch
from torch import nn

from rlinf_cli.api import EnvSpec
from rlinf_cli.errors import UserError
from rlinf_cli.registry import get_registry
from rlinf_cli.settings import plain

MODEL_FILE = "model.safetensors"
CONFIG_FILE = "config.json"


class ActOutput(NamedTuple):
    action: torch.Tensor  # [B, *action_shape] (int64 for discrete)
    logprob: torch.Tensor  # [B]
    value: torch.Tensor  # [B]; zeros when the policy has no critic
    # what the policy needs back to score this action again (API 1.3): float tensors [B, ...] the
    # rollout stores beside the observations, under these keys, and hands to ``evaluate`` in its
    # ``obs`` (a flow head's denoising chain: its log-prob is that of the chain, not of the action)
    extras: dict[str, torch.Tensor] | None = None


class EvalOutput(NamedTuple):
    logprob: torch.Tensor  # [B] (or [B, T] for token policies)
    entropy: torch.Tensor  # same shape as logprob
    value: torch.Tensor  # [B]; zeros when the policy has no critic


class Policy(nn.Module):
    """Base class for model plugins.

    Subclasses implement :meth:`act`, :meth:`evaluate` and :meth:`get_value`, and are built
    as ``cls(config, env_spec)`` where ``config`` is the model's config node (with ``name``).
    """

    has_critic: bool = True
    has_q: bool = False  # action-value heads: the off-policy interface below (SAC)

    def __init__(self, config: Mapping[str, Any], env_spec: EnvSpec):
        super().__init__()

        self.config = dict(plain(config))
        self.env_spec = env_spec

    @property
    def observation_keys(self) -> tuple[str, ...]:
        """The observation entries the model reads; a simulator must provide these (and may give
        more). Models that read a subset say so, so that e.g. a pixel policy cloned from
        ``state_rgb`` demonstrations runs on ``rgb`` alone."""
        return tuple(self.env_spec.observation)

    def act(self, obs: dict[str, torch.Tensor], deterministic: bool = False) -> ActOutput:
        raise NotImplementedError

    def evaluate(self, obs: dict[str, torch.Tensor], action: torch.Tensor) -> EvalOutput:
        raise NotImplementedError

    def get_value(self, obs: dict[str, torch.Tensor]) -> torch.Tensor:
        raise NotImplementedError

    def mean_action(self, obs: dict[str, torch.Tensor]) -> torch.Tensor:
        """Differentiable deterministic action (continuous control), for MSE behaviour cloning."""
        raise NotImplementedError(f"{type(self).__name__} has no mean_action")

    def imitation_loss(self, obs: dict[str, torch.Tensor], actions: torch.Tensor) -> torch.Tensor | None:
        """The model's own behaviour-cloning loss of demonstrated ``actions`` (a scalar), for a
        model whose log-likelihood of an action is not what it should be trained on, or not
        computable (a flow head: the flow-matching loss; API 1.3). None (the default): behaviour
        cloning maximises ``evaluate``'s log-prob (``algo.loss=nll``)."""
        return None

    # -- off-policy interface (models with ``has_q``; what SAC reads) ----------------------------
    # ``sample(obs) -> (action, logprob)``: a reparameterised sample in the env's units (tanh-squashed
    #   into the action bounds) and its log-prob [B], differentiable;
    # ``q_values(obs, action, target=False, detach=False) -> [K, B]``: every Q head (``target``: the
    #   Polyak copies; ``detach``: gradients reach the action, not the heads);
    # ``update_targets(tau)``: target <- (1 - tau) target + tau online;
    # ``log_alpha``: the entropy temperature's log, an ``nn.Parameter`` (optimised and saved with the model).
    def sample(self, obs: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        raise NotImplementedError(f"{type(self).__name__} has no reparameterised sample (off-policy interface)")

    def q_values(self, obs: dict[str, torch.Tensor], action: torch.Tensor, target: bool = False,
                 detach: bool = False) -> torch.Tensor:
        raise NotImplementedError(f"{type(self).__name__} has no Q heads (off-policy interface)")

    def update_targets(self, tau: float) -> None:
        raise NotImplementedError(f"{type(self).__name__} has no target networks (off-policy interface)")

    def critic_parameters(self) -> list[nn.Parameter]:
        """Parameters that only the value estimate uses: a model with a critic returns its value
        head's here. The default declares none.

        A critic warm-up under a cloned actor (``Algorithm.critic_only``: PPO after ``init=``)
        updates these alone: a shared image encoder or task embedding trained on the value loss
        would change the actor's features, and with them the behaviour the warm-up exists to
        protect. Declared, not guessed from parameter names: a guess that matched nothing would
        make the warm-up train nothing without a word; declaring none makes it refuse to start.
        """
        return []

    def add_critic(self) -> bool:
        """Give the policy a fresh critic (a value head) where it has none; True if it now has one.

        ``rlinf rl`` calls it, before the optimizer is made, for an algorithm that uses a critic
        (PPO) when the model has none, so that a model whose critic is optional gets one without a
        setting: a fresh model, and a checkpoint trained without one (``init=`` an SFT or GRPO
        checkpoint; PPO's critic warm-up then trains the new head first). The new head must be in
        :meth:`critic_parameters`, set ``has_critic`` and be saved and loaded with the policy. The
        default cannot add one (the run is refused: a model whose critic is a config option, such
        as ``model.critic`` of ``model=mlp``, builds it from the config instead).
        """
        return False

    def residual(self) -> "Policy | None":
        """A new policy that acts as this one plus a learned correction, which starts at exactly
        zero (residual RL, API 1.5); None (the default) if the model cannot learn one.

        ``rlinf rl init=<clone> init_residual=true`` calls it on a first start, before the
        exploration std is set and the optimizer is made: the clone's weights are frozen as the
        base and RL trains only the correction (and the critic), so the clone itself stays as it
        was and RL's changes are one network's output, added. The new policy must keep the clone's
        critic and action std, be saved and loaded as one checkpoint, and score ``evaluate`` under
        the combined action distribution (docs/algorithms.md, "Residual RL on a clone").
        """
        return None

    def set_action_std(self, std: float | None, trainable: bool = True) -> bool:
        """Reset the exploration noise of continuous actions to ``std`` (None keeps it) and make it
        trainable or fixed; False if the policy has no such noise.

        RL from a cloned policy calls it (``rlinf rl init=... init_action_std=...``): behaviour
        cloning shrinks a learned std until the policy barely explores.
        """
        return False

    def reference(self, start: "Policy | None") -> Any:
        """A frozen policy whose ``evaluate`` scores the run's starting behaviour: the reference of a
        KL term (``Algorithm.needs_reference``; ``rlinf rl`` asks for it once, before training).

        ``start`` is the policy the run began from: this policy itself (a run that has not trained
        yet), the ``init=`` checkpoint loaded again (a resumed run that began from it), or None (a
        resumed run that began from a fresh model: those weights are gone, and the default takes
        the policy as it is now, the closest it has).

        The default keeps a frozen copy: a deep copy of this policy, or ``start`` itself when it is
        another, freshly loaded one. A model that can score its starting behaviour from its own
        weights overrides this to spare the copy (rlinf-model-hf with LoRA: the same model with its
        adapter switched off).
        """
        ref = copy.deepcopy(self) if start is None or start is self else start
        return ref.eval().requires_grad_(False)

    def export(self, path: str | Path) -> str:
        """Write the policy alone, for use outside training, into the new directory ``path``
        (``rlinf export``); returns a few words saying what was written.

        The default is an rlinf model checkpoint of the weights and config (what
        :meth:`save_pretrained` writes; no optimizer or run state). A model with a standard format
        of its own writes that instead (rlinf-model-hf: a plain transformers directory, LoRA merged).
        """
        self.save_pretrained(path)
        return "an rlinf model checkpoint (weights and config)"

    # -- persistence ---------------------------------------------------------------------
    def save_pretrained(self, path: str | Path) -> None:
        from safetensors.torch import save_model

        from rlinf_cli import __version__

        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        state = self.state_dict()
        if _partial_views(state):  # e.g. DeepSpeed ZeRO keeps parameters as views of one flat buffer
            from safetensors.torch import save_file

            save_file({k: v.detach().clone().contiguous() for k, v in state.items()}, str(path / MODEL_FILE))
        else:
            save_model(self, str(path / MODEL_FILE))
        meta = {"model": self.config, "env_spec": self.env_spec.to_dict(), "rlinf_version": __version__}
        (path / CONFIG_FILE).write_text(json.dumps(meta, indent=2))

    @classmethod
    def from_pretrained(cls, path: str | Path, map_location: str | torch.device = "cpu") -> "Policy":
        meta = read_model_config(path)
        policy = cls(meta["model"], EnvSpec.from_dict(meta["env_spec"]))
        load_weights(policy, Path(path), map_location)
        return policy


def declared_critic(policy: Policy, algorithm: str) -> list[nn.Parameter]:
    """The parameters a critic-only iteration of ``algorithm`` trains; one line if there are none."""
    params = list(policy.critic_parameters())
    if not params:
        name = getattr(policy, "config", {}).get("name", type(policy).__name__)
        raise UserError(
            f"algorithm '{algorithm}' trains the critic alone in its first iterations (a warm-up after init=), but "
            f"model '{name}' declares no critic parameters, so the warm-up would train nothing: return the value "
            f"head's parameters from the model's critic_parameters() (docs/plugins.md), or switch the algorithm's "
            f"warm-up off (`rlinf config show rl algo={algorithm}` lists its options)")
    return params


def _partial_views(state: Mapping[str, torch.Tensor]) -> bool:
    """Some tensors are views into a storage they share without being the same tensor (which
    safetensors' ``save_model`` refuses; tied weights, being identical, are fine there)."""
    seen: dict[int, tuple[int, tuple[int, ...]]] = {}
    for t in state.values():
        key = t.untyped_storage().data_ptr()
        ident = (t.data_ptr(), tuple(t.shape))
        if key in seen and seen[key] != ident:
            return True
        seen.setdefault(key, ident)
    return False


def read_model_config(path: str | Path) -> dict[str, Any]:
    path = Path(path)
    cfg_file = path / CONFIG_FILE
    if not path.is_dir():
        raise UserError(f"checkpoint '{path}' does not exist or is not a directory")
    if not cfg_file.is_file() or not (path / MODEL_FILE).is_file():
        raise UserError(f"'{path}' is not an rlinf checkpoint: it needs {CONFIG_FILE} and {MODEL_FILE}")
    try:
        meta = json.loads(cfg_file.read_text())
        meta["model"]["name"]
        meta["env_spec"]["observation"]
    except (ValueError, KeyError, TypeError) as exc:
        raise UserError(f"'{cfg_file}' is not a valid rlinf model config ({exc}); the checkpoint is damaged") from exc
    return meta


def load_weights(policy: nn.Module, path: Path, map_location: str | torch.device = "cpu") -> None:
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    try:
        state = load_file(str(path / MODEL_FILE), device=str(map_location))
    except (SafetensorError, OSError) as exc:
        raise UserError(f"cannot read {path / MODEL_FILE}: {exc}; the checkpoint is damaged") from exc
    try:
        policy.load_state_dict(state, strict=True)
    except RuntimeError as exc:
        first = str(exc).splitlines()[1].strip() if len(str(exc).splitlines()) > 1 else str(exc)
        raise UserError(
            f"checkpoint '{path}' does not match model '{getattr(policy, 'config', {}).get('name', '?')}': "
            f"{first}. Was it saved by another model or for another simulator?"
        ) from exc


def load_policy(path: str | Path, device: str | torch.device = "cpu") -> Policy:
    """Load any rlinf checkpoint: the model plugin is looked up by the name in config.json."""
    meta = read_model_config(path)
    cls = get_registry().load("model", meta["model"]["name"])
    policy = cls.from_pretrained(path, map_location=device)
    return policy.to(device)


def check_compatible(policy: Policy, env_spec: EnvSpec, where: str) -> None:
    """A policy trained for one observation/action layout cannot drive another."""
    policy_spec = policy.env_spec
    for key in policy.observation_keys:
        spec = policy_spec.observation[key]
        got = env_spec.observation.get(key)
        if got is None:
            raise UserError(f"{where} expects observation '{key}' but the simulator gives {sorted(env_spec.observation)}")
        if tuple(got.shape) != tuple(spec.shape):
            raise UserError(f"{where} expects observation '{key}' of shape {tuple(spec.shape)}, the simulator gives {tuple(got.shape)}")
    if len(policy_spec.tasks) > 1 and tuple(env_spec.tasks) != tuple(policy_spec.tasks):
        raise UserError(f"{where} was trained on the tasks {list(policy_spec.tasks)} but the simulator runs "
                        f"{list(env_spec.tasks)}: task ids would name other tasks; use the same task list")
    if policy_spec.num_actions != env_spec.num_actions or tuple(policy_spec.action.shape) != tuple(env_spec.action.shape):
        raise UserError(
            f"{where} acts in {_action_str(policy_spec)} but the simulator expects {_action_str(env_spec)}"
        )


def _action_str(spec: EnvSpec) -> str:
    return f"{spec.num_actions} discrete actions" if spec.discrete else f"continuous actions of shape {tuple(spec.action.shape)}"


def obs_to_torch(obs: Mapping[str, Any], device: torch.device | str = "cpu") -> dict[str, Any]:
    """Numeric entries as tensors on ``device``; text entries (object arrays of strings) stay as they are."""
    return {k: v if getattr(v, "dtype", None) == object else torch.as_tensor(v, device=device) for k, v in obs.items()}
