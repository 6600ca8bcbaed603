"""The embodied rollout: a simulator's envs, placed by an executor, driven by the training policy.

Fixed-length step rollouts (PPO), whole episodes in seed groups (GRPO), or steps into a replay
buffer (SAC) for `rl`, with what a checkpoint needs to continue exactly: seed streams and running
episodes, the recent episodes behind ``rollout/return_mean_100``, the replay buffer and the
running normalization statistics. The saved arrays keep their names (``streams``, ``recent``,
``norm_returns``, ``replay_*``): checkpoints of earlier versions resume.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from rlinf_cli.algorithm import Algorithm
from rlinf_cli.api import EnvSpec, StepBatch
from rlinf_cli.collectors.base import training_seeds
from rlinf_cli.collectors.embodied_env import EmbodiedEnv, runtime_options
from rlinf_cli.collectors.embodied_eval import summarize
from rlinf_cli.collectors.roles import RolloutSettings
from rlinf_cli.data import dataset as ds
from rlinf_cli.errors import UserError
from rlinf_cli.experience import Experience
from rlinf_cli.policy_factory import random_actor
from rlinf_cli.progress import under_way
from rlinf_cli.runtime.batches import ReplayStore
from rlinf_cli.runtime.normalize import Normalizer, resolve
from rlinf_cli.runtime.overlap import OverlappedRunner
from rlinf_cli.runtime.replay import ReplayBuffer
from rlinf_cli.runtime.rollout import EpisodeRecorder, EpisodeStats, Runner, policy_actor, run_episodes
from rlinf_cli.settings import plain

_M64 = (1 << 64) - 1


def rng_words(rng: np.random.Generator) -> np.ndarray:
    """A PCG64 generator's state as int64 words (for a checkpoint)."""
    s = rng.bit_generator.state
    st, inc = int(s["state"]["state"]), int(s["state"]["inc"])
    words = np.array([st >> 64, st & _M64, inc >> 64, inc & _M64, s["has_uint32"], s["uinteger"]], np.uint64)
    return words.view(np.int64)


def rng_from_words(words: np.ndarray) -> np.random.Generator:
    w = [int(x) for x in np.asarray(words, np.int64).view(np.uint64)]
    rng = np.random.Generator(np.random.PCG64())
    rng.bit_generator.state = {"bit_generator": "PCG64", "state": {"state": (w[0] << 64) | w[1], "inc": (w[2] << 64) | w[3]},
                               "has_uint32": w[4], "uinteger": w[5]}
    return rng


def demo_buffer(path: str, spec: EnvSpec, keys: list[str]) -> ReplayBuffer:
    """An `rlinf collect` dataset as a replay buffer of demonstrations (never overwritten).

    The dataset keeps the observation before each step; the next one is the following row of the
    same episode. An episode's last step needs none when it terminated (no bootstrap); a last step
    cut by a time limit has no recorded next observation and is left out.
    """
    data = ds.load(path)
    missing = [k for k in keys if k not in data.spec.observation]
    if missing:
        raise UserError(f"demos={path} has no observation {missing}; the policy reads {keys}")
    for k in keys:
        if tuple(data.spec.observation[k].shape) != tuple(spec.observation[k].shape):
            raise UserError(f"demos={path}: observation '{k}' has shape {tuple(data.spec.observation[k].shape)}, "
                            f"the simulator's {tuple(spec.observation[k].shape)}; were they collected on another task?")
    if data.spec.discrete != spec.discrete or tuple(data.spec.action.shape) != tuple(spec.action.shape):
        raise UserError(f"demos={path} holds actions of another shape than this simulator's")
    n = len(data.rewards)
    last = np.r_[data.episode[1:] != data.episode[:-1], True]
    term = data.terminated if data.terminated is not None else np.zeros(n, bool)
    keep = ~last | (last & term)
    nxt_idx = np.minimum(np.arange(n) + 1, n - 1)
    nxt_idx[last] = np.flatnonzero(last)  # terminated: any observation will do (it is not bootstrapped)
    rows = np.flatnonzero(keep)
    if not len(rows):
        raise UserError(f"demos={path} holds no usable transitions (every episode is one step cut by a time limit)")
    buf = ReplayBuffer(spec, keys, len(rows), what="demonstration buffer")
    buf.add({k: data.obs[k][rows] for k in keys}, data.actions[rows], data.rewards[rows].astype(np.float32),
            {k: data.obs[k][nxt_idx[rows]] for k in keys}, (term & last)[rows])
    return buf


class EmbodiedRollout:
    unit = "steps"  # `rl`'s budget: total_steps env steps

    def __init__(self, env: EmbodiedEnv, settings: RolloutSettings, store: ReplayStore, log: Any = None):
        self.env, self.settings, self.store, self.log = env, settings, store, log  # log: a rich Console (notes)
        self._env: Any = None  # the vector env (or the overlapped runner) collecting
        self.runner: Any = None
        self.recent: list[EpisodeStats] = []  # the last 100 training episodes (rollout/return_mean_100)
        self._spec_rollout: Any = None
        self._rank, self._world = 0, 1
        self._rng: np.random.Generator | None = None  # the warm-up's random actions (off-policy)

    @property
    def spec(self) -> EnvSpec:
        return self.env.spec

    def budget(self) -> int:
        """`rl` runs until ``total_steps`` env steps."""
        return int(self.settings.total_steps)

    def units(self, state: dict[str, Any]) -> float:
        return float(state["env_steps"])

    # -- start -------------------------------------------------------------------------------
    def start(self, policy: Any, algo: Algorithm, rank: int, world: int, state: dict[str, Any],
              saved: dict[str, np.ndarray] | None) -> list[str]:
        """Place the envs and start (or, from ``saved``, continue) their episodes; returns notes."""
        self.env.chunk_for(policy)
        spec = algo.rollout_spec()
        self._spec_rollout, self._rank, self._world = spec, rank, world
        num_envs = spec.groups * spec.group_size if spec.kind == "episodes" else int(self.settings.num_envs)
        if spec.kind == "episodes" and spec.group_size > 1 and not self.spec.per_env_seeds:
            raise UserError(f"--algo {algo.name} compares groups of episodes that start from one seed, but this "
                            f"simulator seeds its whole batch at once (EnvSpec.per_env_seeds=False, a batched engine "
                            f"such as Isaac Lab): its groups would not share initial states. Use --algo ppo")
        executor = self.env.executor(policy_actor(policy, self.spec, self.env.device, False), num_envs)
        first_seeds = training_seeds(int(self.settings.seed), state["iteration"] * world + rank, num_envs)
        overlap = self.settings.overlap_update and spec.kind == "steps"
        notes = self._start_normalizer(num_envs, saved is not None or state["iteration"] > 0, overlap, algo)
        self._restore_stats(num_envs, overlap, saved)
        if overlap:  # the next rollout is collected in another process during the update
            return notes + self._start_overlapped(policy, executor, num_envs, state["iteration"], first_seeds)
        with under_way(self.log, f"starting {num_envs:,} envs", self.settings.progress):
            self._env = executor.make_vec_env(self.env.sim, num_envs, autoreset=spec.kind != "episodes")
            notes.append(f"runtime: {executor.describe()}")
            if spec.kind == "transitions":
                notes += self._start_replay(policy, spec, saved)
            if spec.kind in ("steps", "transitions"):
                notes += self._start_runner(policy, state, saved, first_seeds)
        return notes

    def _restore_stats(self, num_envs: int, overlap: bool, saved: dict[str, np.ndarray] | None) -> None:
        norm = self.env.normalizer
        if norm is not None:
            if overlap:
                raise UserError("runtime.overlap_update=true collects in another process, which cannot share the running "
                                "normalization statistics; set runtime.overlap_update=false or env.normalize_obs/"
                                "normalize_reward=false")
            if saved is not None and "norm_returns" in saved and len(saved["norm_returns"]) == num_envs:
                norm.returns[:] = saved["norm_returns"]
            if self._world > 1:
                norm.track_ranks()
        if saved is not None and "recent" in saved:
            self.recent = [EpisodeStats(float(r), int(n), bool(s), bool(e)) for r, n, s, e in saved["recent"]]

    def _start_overlapped(self, policy: Any, executor: Any, num_envs: int, start_it: int,
                          first_seeds: list[int]) -> list[str]:
        runtime = runtime_options(self.env.settings.runtime)
        self.runner = OverlappedRunner(
            self.env.sim, policy, num_envs, int(self.settings.seed) + 1, lambda i: first_seeds if i == start_it else None,
            start_iteration=start_it, start_method=str(runtime.get("start_method", "forkserver")),
            executor=None if runtime.get("mode", "collocated") == "collocated"
            else (type(executor), {**dict(plain(self.env.settings.executor)), "runtime": runtime}))
        self._env = self.runner
        return ["runtime: rollouts overlap the update in a separate process (one policy version behind)"]

    def _start_runner(self, policy: Any, state: dict[str, Any], saved: dict[str, np.ndarray] | None,
                      first_seeds: list[int]) -> list[str]:
        self.runner = Runner(self._env, policy, self.env.device, self.env.normalizer)
        if saved is not None and "streams" in saved and self.spec.replayable:
            self.runner.restore(saved)
            return []
        self.runner.reset(first_seeds)
        if saved is not None or state["iteration"] > 0:
            return ["resume: the simulator's episodes cannot be replayed (EnvSpec.replayable=False or "
                    "no saved env state); the resumed run starts fresh episodes"]
        return []

    def _start_normalizer(self, num_envs: int, resumed: bool, overlap: bool = False, algo: Any = None) -> list[str]:
        """The statistics this run updates: continued from the checkpoint it starts from, or new.
        ``env.normalize_* = auto`` is decided here (runtime/normalize.py: resolve)."""
        env, init = self.env, self.settings.init
        loaded = env.normalizer
        want, why = resolve(self.settings.normalize, env.sim, loaded, bool(init) or resumed, overlap, algo)
        notes = [why] if why else []
        if loaded is not None:
            have = loaded.config
            if not want.enabled:
                loaded.scale = False  # rewards stay as they are
                return notes + ["normalization: env.normalize_obs/normalize_reward are off; the checkpoint's "
                                "statistics are used frozen (its policy was trained on normalized observations)"]
            if (have.obs, have.reward) != (want.obs, want.reward):
                raise UserError(f"the checkpoint was trained with env.normalize_obs={str(have.obs).lower()} "
                                f"env.normalize_reward={str(have.reward).lower()}; continue it with the same settings")
            env.normalizer = loaded.continue_training(want, num_envs)
            return notes + ["normalization: continuing the checkpoint's running statistics"]
        if not want.enabled:
            return notes
        if init and not resumed and want.obs:
            raise UserError(f"init={init} has no observation statistics (it was not trained with "
                            f"env.normalize_obs=true): its policy expects raw observations; set env.normalize_obs=false")
        env.normalizer = Normalizer(self.spec, want, num_envs)
        if want.obs:
            notes.append(f"normalization: observations {env.normalizer.keys or '(none: no float entries)'}")
        if want.reward:
            notes.append("normalization: rewards scaled by the std of the discounted return")
        return notes

    # -- transitions (off-policy) ------------------------------------------------------------
    def _start_replay(self, policy: Any, spec: Any, saved: dict[str, np.ndarray] | None) -> list[str]:
        """The replay buffer (restored from ``saved``) and the demonstrations of ``demos=``."""
        keys = [k for k in policy.observation_keys]
        store = self.store
        store.replay = ReplayBuffer(self.spec, keys, spec.buffer_size)
        store.batch_size, store.demo_fraction = spec.batch_size, spec.demo_fraction
        self._rng = np.random.default_rng([int(self.settings.seed), self._rank, 17])  # warm-up actions
        notes = [f"replay buffer: {spec.buffer_size:,} transitions, {store.replay.nbytes / 2**20:,.0f} MiB"]
        if saved is not None:
            if store.replay.load(saved):
                if "replay_rng" in saved:  # the warm-up's random actions continue their stream
                    self._rng = rng_from_words(saved["replay_rng"])
                notes.append(f"replay buffer restored: {len(store.replay):,} transitions")
            else:
                notes.append("resume: the checkpoint holds no replay buffer; it refills from the resumed run")
        store.demos = None
        source = self.settings.demos
        if source:
            store.demos = demo_buffer(str(source), self.spec, keys)
            notes.append(f"demonstrations: {len(store.demos):,} transitions from {source}; "
                         f"{spec.demo_fraction:.0%} of every batch")
            if spec.demo_fraction <= 0:
                raise UserError(f"demos={source} is given but the algorithm draws no share of its batches from "
                                f"demonstrations (algo.demo_fraction=0); set it, e.g. algo.demo_fraction=0.5")
        return notes

    def _random_actions(self, obs: Any) -> np.ndarray:
        return random_actor(self.spec, self._rng)(obs)[1]

    def _add_transitions(self, obs: Any, actions: np.ndarray, sb: StepBatch) -> None:
        replay = self.store.replay
        nxt = sb.obs
        ended = sb.terminated | sb.truncated
        if sb.final_obs is not None and ended.any():  # the env auto-reset: the transition ends in the final obs
            nxt = {k: np.where(ended.reshape(-1, *([1] * (nxt[k].ndim - 1))), sb.final_obs[k], nxt[k])
                   for k in replay.keys}
        replay.add(obs, actions, sb.reward, nxt, sb.terminated)

    # -- collect -----------------------------------------------------------------------------
    def collect(self, policy: Any, algo: Algorithm, iteration: int) -> Experience:
        spec = self._spec_rollout
        self.store.normalizer = self.env.normalizer  # what the update's replay batches are normalized by
        if spec.kind == "steps":
            exp = self.runner.collect_steps(spec.steps)
        elif spec.kind == "transitions":
            warm = self.store.replay.added < spec.warmup_steps
            exp = self.runner.collect_steps(spec.steps, sink=self._add_transitions,
                                            explore=self._random_actions if warm else None)
            exp.stats["replay_size"] = float(len(self.store.replay))
        elif spec.kind == "episodes":
            exp = self._collect_groups(policy, algo, iteration)
        else:
            raise UserError(f"algorithm '{algo.name}' learns from rollout='{spec.kind}', which `rlinf rl` cannot "
                            f"collect on an embodied simulator yet")
        if self.env.normalizer is not None and self._world > 1:
            self.env.normalizer.sync()  # every rank's new observations, merged: the same statistics everywhere
        self.recent = (self.recent + exp.episodes)[-100:]
        return exp

    def _collect_groups(self, policy: Any, algo: Algorithm, iteration: int) -> Experience:
        spec = self._spec_rollout
        seeds = training_seeds(int(self.settings.seed), iteration * self._world + self._rank, spec.groups)
        recorder = EpisodeRecorder()
        norm = self.env.normalizer  # group rollouts: observations only (a group compares whole-episode returns)
        transform = (lambda o: norm.observe(o, True)) if norm is not None else None
        episodes = run_episodes(self._env, policy_actor(policy, self.spec, self.env.device, False),
                                [s for s in seeds for _ in range(spec.group_size)], recorder, transform=transform)
        exp = recorder.to_experience(episodes, spec.group_size, self.env.device)
        keep = algo.filter_groups(exp.episode_returns)
        if keep is not None:  # dropped groups stay in the batch with no weight
            exp.mask = exp.mask * keep.repeat_interleave(spec.group_size).to(exp.mask).unsqueeze(0)
        return exp

    @torch.no_grad()
    def logprobs(self, policy: Any, exp: Experience) -> torch.Tensor:
        """``policy``'s log-probs of the experience's actions ([T, N]; a frozen reference policy)."""
        T, N = exp.rewards.shape
        obs = {k: v.reshape(T * N, *v.shape[2:]) for k, v in exp.obs.items()}
        return policy.evaluate(obs, exp.actions.reshape(T * N, *exp.actions.shape[2:])).logprob.reshape(T, N)

    def metrics(self, exp: Experience, seconds: float) -> dict[str, float]:
        """Rollout numbers of ``exp``, which took ``seconds`` to collect and learn from."""
        out = {f"rollout/{k}": v for k, v in exp.stats.items()}
        out["time/env_steps_per_s"] = exp.env_steps / max(seconds, 1e-9)
        if exp.episodes:
            s = summarize(exp.episodes, self.spec.has_success)
            out.update({f"rollout/{k}": v for k, v in s.items() if k != "return_std"})
        if self.recent:
            out["rollout/return_mean_100"] = float(np.mean([e.ret for e in self.recent]))
        return out

    def info(self, metrics: dict[str, float]) -> str:
        shown = (("return", "rollout/return_mean", ".1f"), ("success", "rollout/success_once", ".0%"))
        return "  ".join(f"{name} {metrics[key]:{fmt}}" for name, key, fmt in shown if key in metrics)

    # -- resume ------------------------------------------------------------------------------
    def state(self) -> dict[str, np.ndarray]:
        """What a checkpoint needs to continue exactly: running episodes (replayed on resume) and
        the recent episodes behind ``rollout/return_mean_100``."""
        out = dict(self.runner.state()) if isinstance(self.runner, Runner) else {}
        out["recent"] = np.array([[e.ret, e.length, e.success_once, e.success_at_end] for e in self.recent],
                                 dtype=np.float64).reshape(-1, 4)
        norm = self.env.normalizer
        if norm is not None and not norm.frozen:
            out["norm_returns"] = norm.returns.copy()  # this rank's running discounted returns
        if self.store.replay is not None:
            out.update(self.store.replay.state())
            out["replay_rng"] = rng_words(self._rng)
        return out

    def save_files(self, directory: Any) -> None:
        """Files a checkpoint holds besides the policy (rank 0 writes them): the normalization statistics."""
        if self.env.normalizer is not None:
            self.env.normalizer.save(directory)

    def close(self) -> None:
        if self._env is not None:
            self._env.close()
            self._env = None
