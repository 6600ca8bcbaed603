"""Running normalization of observations and rewards (``env.normalize_obs``, ``env.normalize_reward``).

Observations: every float array entry of the observation (never images, integers or text) is
shifted and scaled by its running mean and variance, then clipped to ``+-env.clip_obs``.
Rewards: divided by the running standard deviation of the discounted return (the scaling of
Engstrom et al., 2020, as in Stable-Baselines3's ``VecNormalize``), then clipped to
``+-env.clip_reward``; the mean is not subtracted, so the sign of a reward never flips.

The statistics live in the trainer process, on the batched observations the policy acts on, so
envs in worker processes, Ray actors or env servers all feed the same statistics. Under
torchrun each rank updates its own copy while it collects and :meth:`Normalizer.sync` merges
every rank's new data in a fixed rank order at the end of each rollout, so all ranks hold the
same statistics afterwards. They are saved with every `rl` checkpoint (``normalizer.safetensors``)
and used, frozen, wherever a checkpoint acts (`eval`, `collect`, `rl` evaluations, `rl init=`).

Both switches default to ``auto``, which :func:`resolve` decides: on where the simulator recommends
it (the gymnasium plugin does for state-based continuous control, where it makes MuJoCo locomotion
learn like Stable-Baselines3's ``VecNormalize`` runs), unless the checkpoint the run starts from,
``runtime.overlap_update`` or the algorithm (SAC) says otherwise.
"""

from __future__ import annotations

from dataclasses import astuple, dataclass, replace
from pathlib import Path
from typing import Any, Callable, Mapping

import numpy as np

from rlinf_cli.api import EnvSpec, Obs
from rlinf_cli.errors import UserError

FILE = "normalizer.safetensors"


@dataclass(frozen=True)
class NormalizeConfig:
    """The ``env.*`` keys this module reads (see conf/common.yaml)."""

    obs: bool = False  # env.normalize_obs
    reward: bool = False  # env.normalize_reward
    clip_obs: float = 10.0  # env.clip_obs
    clip_reward: float = 10.0  # env.clip_reward
    gamma: float = 0.99  # env.normalize_gamma: discount of the return whose std scales rewards
    eps: float = 1e-8  # env.normalize_eps

    @classmethod
    def from_env(cls, env: Any, auto: tuple[bool, bool] = (False, False)) -> "NormalizeConfig":
        """The ``env.*`` settings; ``auto`` is what ``env.normalize_obs`` / ``normalize_reward``
        = ``auto`` stand for (see :func:`resolve`)."""
        get = (lambda k, d: env.get(k, d)) if env is not None else (lambda k, d: d)
        obs, reward = switches(env)
        cfg = cls(auto[0] if obs is None else obs, auto[1] if reward is None else reward,
                  float(get("clip_obs", 10.0)), float(get("clip_reward", 10.0)),
                  float(get("normalize_gamma", 0.99)), float(get("normalize_eps", 1e-8)))
        if cfg.clip_obs <= 0 or cfg.clip_reward <= 0:
            raise UserError(f"env.clip_obs and env.clip_reward must be > 0, got {cfg.clip_obs} and {cfg.clip_reward}")
        if not 0.0 <= cfg.gamma <= 1.0:
            raise UserError(f"env.normalize_gamma must be in [0, 1], got {cfg.gamma}")
        return cfg

    @property
    def enabled(self) -> bool:
        return self.obs or self.reward


AUTO = "auto"


def _switch(value: Any, key: str) -> bool | None:
    if isinstance(value, bool):
        return value
    if value is None or value == AUTO:
        return None
    raise UserError(f"{key} must be true, false or auto, got {value!r}")


def switches(env: Any) -> tuple[bool | None, bool | None]:
    """``(env.normalize_obs, env.normalize_reward)`` as set: True, False, or None for ``auto``."""
    get = (lambda k: env.get(k, AUTO)) if env is not None else (lambda k: AUTO)
    return _switch(get("normalize_obs"), "env.normalize_obs"), _switch(get("normalize_reward"), "env.normalize_reward")


def recommended(simulator: Any) -> bool:
    """Whether the simulator recommends running normalization (its optional ``normalize_default``
    attribute: state-based continuous control, where it helps); False when it says nothing."""
    return getattr(simulator, "normalize_default", None) is True


def resolve(env: Any, simulator: Any, checkpoint: "Normalizer | None", from_checkpoint: bool,
            overlap: bool = False, algorithm: Any = None) -> tuple[NormalizeConfig, str | None]:
    """The normalization an `rl` run uses, with ``auto`` switches decided, and why (a note, or
    None when nothing was left to ``auto``).

    ``auto`` follows, in order: the statistics of the checkpoint the run starts from (``init=``
    or a resume: its policy was trained on what they say), off for a checkpoint without
    statistics (a cloned or unnormalized policy expects raw observations), off with
    ``runtime.overlap_update`` (the collecting process cannot share running statistics), off for
    an algorithm whose ``normalize_auto`` is False (SAC), and otherwise the simulator's
    recommendation (:func:`recommended`).
    """
    obs, reward = switches(env)
    if obs is not None and reward is not None:
        return NormalizeConfig.from_env(env), None
    if checkpoint is not None:
        auto, why = (checkpoint.config.obs, checkpoint.config.reward), "as the checkpoint was trained"
    elif from_checkpoint:
        auto, why = (False, False), "off: the checkpoint has no statistics (its policy expects raw observations)"
    elif overlap:
        auto, why = (False, False), "off: runtime.overlap_update cannot share running statistics"
    elif algorithm is not None and getattr(algorithm, "normalize_auto", True) is False:
        name = getattr(algorithm, "name", "") or type(algorithm).__name__
        auto, why = (False, False), f"off: algorithm '{name}' does not take it by default"
    elif recommended(simulator):
        auto, why = (True, True), "on: the simulator recommends it (state-based continuous control)"
    else:
        auto, why = (False, False), "off: the simulator does not recommend it"
    cfg = NormalizeConfig.from_env(env, auto)
    which = " and ".join(k for k, v in (("env.normalize_obs", obs), ("env.normalize_reward", reward)) if v is None)
    return cfg, f"normalization: {which}=auto -> {why}; set true or false to choose"


class RunningMeanStd:
    """Mean and variance of a stream of arrays (Chan et al.'s parallel update, float64).

    Starts at mean 0, variance 1 and a tiny count (as Stable-Baselines3 does), so the first
    batch of one sample does not divide by a zero variance. ``count=0`` makes an empty
    accumulator (the data one rank adds between two synchronisations).
    """

    def __init__(self, shape: tuple[int, ...] = (), count: float = 1e-4):
        self.mean = np.zeros(shape, np.float64)
        self.var = np.ones(shape, np.float64) if count else np.zeros(shape, np.float64)
        self.count = float(count)

    def update(self, x: np.ndarray) -> None:
        x = np.asarray(x, np.float64).reshape(-1, *self.mean.shape)
        n = len(x)
        if n:
            # np.mean's and np.var's own arithmetic (sum then divide; squared deviations from that
            # mean), bit for bit, without their Python wrappers: this runs every env step
            mean = x.sum(axis=0) / n
            d = x - mean
            self.merge(mean, (d * d).sum(axis=0) / n, float(n))

    def merge(self, mean: np.ndarray, var: np.ndarray, count: float) -> None:
        if count <= 0:
            return
        total = self.count + count
        delta = mean - self.mean
        m2 = self.var * self.count + var * count + delta * delta * self.count * count / total
        self.mean = self.mean + delta * count / total
        self.var = m2 / total
        self.count = total

    def copy(self) -> "RunningMeanStd":
        out = RunningMeanStd(self.mean.shape, 0)
        out.mean, out.var, out.count = self.mean.copy(), self.var.copy(), self.count
        return out


def normalized_keys(spec: EnvSpec) -> list[str]:
    """Observation entries that get normalized: float arrays (never images, integers or text)."""
    return [k for k, s in spec.observation.items() if not s.is_text and str(s.dtype).startswith("float")]


class Normalizer:
    """The running statistics of one run, and the transforms that use them.

    ``frozen`` normalizers (evaluation, a checkpoint loaded for `eval` / `collect`) never update.
    """

    def __init__(self, spec: EnvSpec, config: NormalizeConfig, num_envs: int = 0):
        self.config = config
        self.keys = normalized_keys(spec) if config.obs else []
        self.obs_rms = {k: RunningMeanStd(tuple(spec.observation[k].shape)) for k in self.keys}
        self.ret_rms = RunningMeanStd(())
        self.returns = np.zeros(num_envs, np.float64)  # per env: discounted return so far (reward scaling)
        self.scale = config.reward  # scale rewards (off for a checkpoint's statistics used frozen in a run without)
        self.frozen = False
        # under torchrun: the statistics all ranks agreed on last, and what this rank added since
        self._synced: dict[str, RunningMeanStd] | None = None
        self._delta: dict[str, RunningMeanStd] = {}

    # -- transforms ----------------------------------------------------------------------------
    def observe(self, obs: Obs, update: bool = True) -> Obs:
        """``obs`` with its float entries normalized (a new dict; other entries are the same
        objects). With ``update`` (and not frozen), the statistics first take in ``obs``."""
        if not self.keys:
            return obs
        if update and not self.frozen:
            for k in self.keys:
                self._update(k, obs[k])
        out = dict(obs)
        c = self.config.clip_obs
        for k in self.keys:
            rms = self.obs_rms[k]
            x = (np.asarray(obs[k], np.float64) - rms.mean) / np.sqrt(rms.var + self.config.eps)
            out[k] = np.minimum(np.maximum(x, -c), c).astype(np.float32)
        return out

    def reward(self, reward: np.ndarray, done: np.ndarray, lo: int = 0) -> np.ndarray:
        """Scaled rewards of envs ``lo .. lo + len(reward) - 1`` (float32); updates the running
        discounted returns of those envs and, unless frozen, their statistics."""
        if not self.scale:
            return reward
        hi = lo + len(reward)
        if not self.frozen:
            ret = self.returns[lo:hi] * self.config.gamma + reward
            self._update("__return__", ret)
            self.returns[lo:hi] = np.where(done, 0.0, ret)
        return self.scale_rewards(reward)

    def scale_rewards(self, reward: np.ndarray) -> np.ndarray:
        """``reward`` scaled by the current statistics, without updating them (replay samples)."""
        if not self.scale:
            return reward
        c = self.config.clip_reward
        r = np.asarray(reward, np.float64) / np.sqrt(self.ret_rms.var + self.config.eps)
        return np.minimum(np.maximum(r, -c), c).astype(np.float32)

    def frozen_copy(self) -> "Normalizer":
        """A normalizer with these statistics that never updates (evaluation)."""
        out = Normalizer.__new__(Normalizer)
        out.config, out.keys = self.config, list(self.keys)
        out.obs_rms = {k: v.copy() for k, v in self.obs_rms.items()}
        out.ret_rms = self.ret_rms.copy()
        out.returns = np.zeros(0)
        out.scale = self.scale
        out.frozen, out._synced, out._delta = True, None, {}
        return out

    def actor(self, act: Callable[[Obs], Any]) -> Callable[[Obs], Any]:
        """``act`` fed normalized observations (frozen statistics)."""
        frozen = self.frozen_copy()

        def normalized(obs: Obs) -> Any:
            return act(frozen.observe(obs, update=False))

        return normalized

    def _update(self, key: str, x: np.ndarray) -> None:
        """Take ``x`` into the statistics of ``key`` and, under torchrun, into what this rank added since."""
        rms = self.ret_rms if key == "__return__" else self.obs_rms[key]
        rms.update(x)
        if self._synced is not None:
            if key not in self._delta:
                self._delta[key] = RunningMeanStd(rms.mean.shape, 0)
            self._delta[key].update(x)

    # -- ranks ---------------------------------------------------------------------------------

    def track_ranks(self) -> None:
        """Keep what this rank adds from now on apart, for :meth:`sync` (torchrun)."""
        self._synced = {**{k: v.copy() for k, v in self.obs_rms.items()}, "__return__": self.ret_rms.copy()}
        self._delta = {}

    def sync(self, gather: Callable[[Any], list[Any]] | None = None) -> None:
        """Merge every rank's new data, in rank order, into the statistics all ranks agreed on
        last: afterwards every rank holds the same numbers. ``gather(obj)`` returns every rank's
        ``obj`` in rank order (default: ``torch.distributed.all_gather_object``)."""
        if self._synced is None or self.frozen:
            return
        mine = {k: (v.mean, v.var, v.count) for k, v in self._delta.items()}
        deltas = (gather or _all_gather)(mine)
        merged = {k: v.copy() for k, v in self._synced.items()}
        for rank_delta in deltas:
            for k, (mean, var, count) in rank_delta.items():
                merged[k].merge(mean, var, count)
        self.ret_rms = merged.pop("__return__")
        self.obs_rms = merged
        self.track_ranks()

    # -- persistence ---------------------------------------------------------------------------
    def state(self) -> dict[str, np.ndarray]:
        """The statistics as arrays (what ``normalizer.safetensors`` holds)."""
        out: dict[str, np.ndarray] = {"config": np.array(astuple(self.config), np.float64)}
        for k, rms in [*self.obs_rms.items(), ("__return__", self.ret_rms)]:
            out[f"{k}.mean"], out[f"{k}.var"] = rms.mean, rms.var
            out[f"{k}.count"] = np.array([rms.count], np.float64)
        return out

    @classmethod
    def from_state(cls, spec: EnvSpec, state: Mapping[str, np.ndarray], where: str = "checkpoint") -> "Normalizer":
        try:
            o, r, co, cr, g, e = (float(x) for x in state["config"])
            norm = cls(spec, NormalizeConfig(bool(o), bool(r), co, cr, g, e))
            for k, rms in [*norm.obs_rms.items(), ("__return__", norm.ret_rms)]:
                rms.mean = np.asarray(state[f"{k}.mean"], np.float64).reshape(rms.mean.shape)
                rms.var = np.asarray(state[f"{k}.var"], np.float64).reshape(rms.var.shape)
                rms.count = float(np.asarray(state[f"{k}.count"]).reshape(-1)[0])
        except (KeyError, ValueError, TypeError) as exc:
            raise UserError(f"{where}: {FILE} does not fit this simulator's observations ({type(exc).__name__}: "
                            f"{exc}); was it written for another simulator?") from exc
        return norm

    def save(self, directory: Path) -> None:
        from safetensors.numpy import save_file

        save_file({k: np.ascontiguousarray(v) for k, v in self.state().items()}, str(Path(directory) / FILE))

    @classmethod
    def load(cls, directory: str | Path, spec: EnvSpec) -> "Normalizer | None":
        """The statistics saved in checkpoint ``directory`` (frozen), or None if it has none."""
        f = Path(directory) / FILE
        if not f.is_file():
            return None
        from safetensors.numpy import load_file

        try:
            state = load_file(str(f))
        except Exception as exc:
            raise UserError(f"cannot read {f}: {type(exc).__name__}; the checkpoint is damaged") from exc
        norm = cls.from_state(spec, state, f"checkpoint '{directory}'")
        norm.frozen = True
        return norm

    def continue_training(self, config: NormalizeConfig, num_envs: int) -> "Normalizer":
        """These statistics, updating again under ``config`` (same keys normalized)."""
        self.frozen = False
        self.returns = np.zeros(num_envs, np.float64)
        self.config = replace(config, obs=self.config.obs, reward=self.config.reward)
        return self


def _all_gather(obj: Any) -> list[Any]:
    import torch.distributed as dist

    out: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out
