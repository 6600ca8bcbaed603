"""The embodied collector: a simulator's envs, placed by an executor, driven by a policy.

It turns every stage's needs into env work: fixed-length step rollouts (PPO) or whole episodes
in seed groups (GRPO) for `rl`, held-out evaluation episodes for every stage, demonstration
episodes for `collect` and parquet datasets for `sft`. Env state that a checkpoint needs (seed
streams, running episodes) lives here too.
"""

from __future__ import annotations

from typing import Any, Callable, Iterable, Iterator, Sequence

import numpy as np
import torch

from rlinf_cli.algorithm import Algorithm, MiniBatch
from rlinf_cli.api import EnvSpec, Executor, Obs, Simulator, StepBatch
from rlinf_cli.collectors.base import Evaluation, training_seeds
from rlinf_cli.errors import UserError
from rlinf_cli.experience import Experience
from rlinf_cli.progress import under_way
from rlinf_cli.registry import get_registry, make_simulator
from rlinf_cli.runtime.rollout import EpisodeRecorder, EpisodeStats, Recorder, Runner, policy_actor, run_episodes
from rlinf_cli.settings import plain


def make_executor(node: Any, runtime: dict[str, Any] | None = None) -> Executor:
    """Build the executor; ``runtime`` (from :func:`runtime_options`) goes in as its ``runtime`` entry."""
    data = dict(plain(node))
    if runtime is not None:
        data["runtime"] = dict(runtime)
    return get_registry().load("executor", data["name"])(data)


def runtime_options(cfg: Any, act: Callable | None = None, spec: EnvSpec | None = None,
                    num_envs: int | None = None) -> dict[str, Any]:
    """The ``runtime`` and ``env`` transport settings as one dict for the executor.

    With ``runtime.mode=auto`` and a policy ``act`` function, the policy's inference time on a
    batch of ``num_envs`` is measured here (``infer_s``); the executor probes the simulator.
    """
    out: dict[str, Any] = dict(plain(cfg.runtime)) if cfg.get("runtime") is not None else {}
    env = cfg.get("env")
    if env is not None:
        out.update({"obs_compression": env.get("obs_compression", "none"), "obs_delta": bool(env.get("obs_delta", False)),
                    "compression_level": int(env.get("compression_level", 1))})
    if out.get("mode") == "auto" and act is not None and spec is not None and num_envs:
        from rlinf_cli.runtime.placement import time_inference

        out["infer_s"] = time_inference(act, spec, int(num_envs))
    return out


# -- actors (observations -> env actions) -------------------------------------------------------
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


_M64 = (1 << 64) - 1


def _rng_state(rng: np.random.Generator) -> np.ndarray:
    """A PCG64 generator's state as int64 words (for a checkpoint)."""
    s = rng.bit_generator.state
    st, inc = int(s["state"]["state"]), int(s["state"]["inc"])
    words = np.array([st >> 64, st & _M64, inc >> 64, inc & _M64, s["has_uint32"], s["uinteger"]], np.uint64)
    return words.view(np.int64)


def _rng_from(words: np.ndarray) -> np.random.Generator:
    w = [int(x) for x in np.asarray(words, np.int64).view(np.uint64)]
    rng = np.random.Generator(np.random.PCG64())
    rng.bit_generator.state = {"bit_generator": "PCG64", "state": {"state": (w[0] << 64) | w[1], "inc": (w[2] << 64) | w[3]},
                               "has_uint32": w[4], "uinteger": w[5]}
    return rng


def demo_buffer(path: str, spec: EnvSpec, keys: list[str]) -> Any:
    """An `rlinf collect` dataset as a replay buffer of demonstrations (never overwritten).

    The dataset keeps the observation before each step; the next one is the following row of the
    same episode. An episode's last step needs none when it terminated (no bootstrap); a last step
    cut by a time limit has no recorded next observation and is left out.
    """
    from rlinf_cli.data import dataset as ds
    from rlinf_cli.runtime.replay import ReplayBuffer

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


# -- summaries and tables ----------------------------------------------------------------------
def summarize(episodes: Sequence[EpisodeStats], has_success: bool = True) -> dict[str, float]:
    """Mean/std return, success rates (only where the simulator reports success), mean length."""
    if not episodes:
        return {}
    rets = np.array([e.ret for e in episodes])
    out = {"episodes": float(len(episodes)), "return_mean": float(rets.mean()), "return_std": float(rets.std())}
    if has_success:
        out["success_once"] = float(np.mean([e.success_once for e in episodes]))
        out["success_at_end"] = float(np.mean([e.success_at_end for e in episodes]))
    out["length_mean"] = float(np.mean([e.length for e in episodes]))
    return out


def summarize_by_task(episodes: Sequence[EpisodeStats], tasks: Sequence[str],
                      has_success: bool = True) -> dict[str, dict[str, float]]:
    """Task name -> :func:`summarize` of its episodes, for simulators with several tasks."""
    by_task = {name: [e for e in episodes if e.task == index] for index, name in enumerate(tasks)}
    return {name: summarize(mine, has_success) for name, mine in by_task.items() if mine}


def task_mean(per_task: dict[str, dict[str, float]]) -> dict[str, float]:
    """Each number averaged over tasks (every task weighs the same, whatever its episode count)."""
    if not per_task:
        return {}
    keys = set.intersection(*(set(s) for s in per_task.values()))
    out = {k: float(np.mean([s[k] for s in per_task.values()])) for k in sorted(keys)}
    out["episodes"] = float(sum(s["episodes"] for s in per_task.values()))
    out["tasks"] = float(len(per_task))
    return out


def eval_table(rows: dict[str, dict[str, float]], title: str, instructions: dict[str, str] | None = None) -> Any:
    """A rich table: one row per policy/label with the summary numbers; under it the legend and,
    with ``instructions`` (row label -> text), what the policy was told on that row's episodes."""
    from rich.table import Table

    from rlinf_cli.tables import RESULT_HEADERS, RESULT_LEGEND, instruction_notes, result_cells, with_notes

    table = Table(title=title)
    table.add_column("policy")
    for col in RESULT_HEADERS:
        table.add_column(col, justify="right")
    for label, s in rows.items():
        table.add_row(label, *result_cells(s))
    return with_notes(table, [RESULT_LEGEND, *(instruction_notes(instructions) if instructions else [])])


def instructions_by_row(episodes: Sequence[EpisodeStats], rows: dict[str, Any], label: str,
                        tasks: Sequence[str]) -> dict[str, str]:
    """Row label -> the instruction its episodes were given (several differing: joined with ' | ')."""
    def told(eps: Sequence[EpisodeStats]) -> str:
        return " | ".join(dict.fromkeys(e.instruction for e in eps if e.instruction))

    out = {f"{label} · {name}": told([e for e in episodes if e.task == i]) for i, name in enumerate(tasks)}
    out = {k: v for k, v in out.items() if k in rows and v}
    if label in rows and told(episodes):
        out[label] = told(episodes)
    return out


class EmbodiedCollector:
    modality = "embodied"
    unit = "steps"  # `rl`'s budget: total_steps env steps

    def __init__(self, cfg: Any, ctx: Any, sim_node: Any = None):
        self.cfg, self.ctx = cfg, ctx
        self._node = sim_node
        self._sim: Simulator | None = None
        self._executor: Executor | None = None
        self._env: Any = None
        self.runner: Any = None
        self.recent: list[EpisodeStats] = []  # the last 100 training episodes (rollout/return_mean_100)
        self._spec_rollout: Any = None
        # running obs/reward statistics (runtime/normalize.py): the loaded checkpoint's (frozen),
        # or the ones this `rl` run updates; None = no normalization
        self.normalizer: Any = None

    @property
    def sim(self) -> Simulator:
        """Built on first use: `sft` on a dataset whose simulator is not installed still trains."""
        if self._sim is None:
            if self._node is None:
                raise UserError("this dataset does not name the simulator that recorded it; pass sim=...")
            self._sim = make_simulator(self._node)
        return self._sim

    @property
    def spec(self) -> EnvSpec:
        return self.sim.spec

    @property
    def label(self) -> str:
        name = plain(self._node).get("name", "sim") if self._node is not None else "dataset"
        return str(getattr(self._sim, "label", None) or name)

    # -- policies ---------------------------------------------------------------------------
    def policy(self, source: str | None, model_node: Any = None, spec: EnvSpec | None = None,
               check: bool = True) -> Any:
        """A policy loaded from checkpoint ``source`` (checked against ``spec``, by default this
        simulator's, unless ``check`` is off), or a fresh one for ``spec`` from the ``model`` config."""
        from rlinf_cli.policy import check_compatible, load_policy

        spec = spec or self.spec
        if source:
            from rlinf_cli.runtime.normalize import Normalizer

            policy = load_policy(source, self.ctx.device)
            if check:
                check_compatible(policy, spec, f"checkpoint '{source}'")
            # a policy trained on normalized observations acts through its statistics, frozen
            self.normalizer = Normalizer.load(source, policy.env_spec)
            return policy
        model = get_registry().get("model", model_node.name)
        if model.attrs.get("modality") == "text":
            raise UserError(f"model '{model_node.name}' is a language model; simulator '{self.label}' needs a "
                            f"policy for its observations (model=mlp)")
        return model.load()(model_node, spec).to(self.ctx.device)

    def prepare_rl(self, policy: Any, cfg: Any, fresh: bool | None = None) -> None:
        """RL from a cloned policy (``init=``): cloning shrank its action std until it barely
        explores, so it is reset, and kept fixed so PPO cannot collapse or inflate it while the
        mean improves. A resumed run keeps the std it had (``fresh=True``: prepare the init=
        policy as the run's start did, e.g. a resumed run's KL reference)."""
        fresh = bool(cfg.init and not cfg.resume) if fresh is None else fresh
        std = cfg.get("init_action_std") if fresh else None
        if std is not None and std <= 0:
            raise UserError(f"init_action_std must be > 0 (or null to keep the checkpoint's), got {std}")
        learn = cfg.get("learn_action_std")
        learn = not cfg.init if learn is None else bool(learn)
        if std is not None or not learn:
            policy.set_action_std(None if std is None else float(std), trainable=learn)

    def chunk_for(self, policy: Any) -> None:
        """A policy that emits K actions per step (``action_chunk``) gets envs that execute them:
        the simulator is wrapped once (rlinf_cli/runtime/chunking.py)."""
        from rlinf_cli.runtime.chunking import ChunkedSimulator, chunk_of

        k = chunk_of(policy)
        if k > 1 and not isinstance(self.sim, ChunkedSimulator):
            self._sim = ChunkedSimulator(self.sim, k)
            self._executor = None  # placed again for the chunked spec

    def actor(self, source: str, deterministic: bool, seed: int) -> Callable:
        """``act(obs) -> (output, env actions)`` for ``random``, ``expert`` or a checkpoint."""
        if source == "random":
            return random_actor(self.spec, np.random.default_rng(seed))
        if source == "expert":
            return expert_actor(self.sim)
        policy = self.policy(source)
        policy.eval()
        self.chunk_for(policy)
        return self._policy_actor(policy, deterministic)

    def _policy_actor(self, policy: Any, deterministic: bool) -> Callable:
        """``act`` for a policy, fed observations normalized by the current statistics (frozen)."""
        act = policy_actor(policy, self.spec, self.ctx.device, deterministic)
        return act if self.normalizer is None else self.normalizer.actor(act)

    def _start_normalizer(self, num_envs: int, resumed: bool, overlap: bool = False, algo: Any = None) -> list[str]:
        """The statistics this run updates: continued from the checkpoint it starts from, or new.
        ``env.normalize_* = auto`` is decided here (runtime/normalize.py: resolve)."""
        from rlinf_cli.runtime.normalize import Normalizer, resolve

        loaded = self.normalizer
        want, why = resolve(self.cfg.get("env"), self.sim, loaded, bool(self.cfg.get("init")) or resumed, overlap, algo)
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
            self.normalizer = loaded.continue_training(want, num_envs)
            return notes + ["normalization: continuing the checkpoint's running statistics"]
        if not want.enabled:
            return notes
        if self.cfg.get("init") and not resumed and want.obs:
            raise UserError(f"init={self.cfg.init} has no observation statistics (it was not trained with "
                            f"env.normalize_obs=true): its policy expects raw observations; set env.normalize_obs=false")
        self.normalizer = Normalizer(self.spec, want, num_envs)
        if want.obs:
            notes.append(f"normalization: observations {self.normalizer.keys or '(none: no float entries)'}")
        if want.reward:
            notes.append("normalization: rewards scaled by the std of the discounted return")
        return notes

    def executor(self, act: Callable | None = None, num_envs: int | None = None) -> Executor:
        if self._executor is None:
            self._executor = make_executor(self.cfg.executor, runtime_options(self.cfg, act, self.spec, num_envs))
        return self._executor

    # -- rl ---------------------------------------------------------------------------------
    def budget(self, cfg: Any) -> int:
        """`rl` runs until ``total_steps`` env steps."""
        return int(cfg.total_steps)

    def units(self, state: dict[str, Any]) -> float:
        return float(state["env_steps"])

    def start(self, policy: Any, algo: Algorithm, rank: int, world: int, state: dict[str, Any],
              saved: dict[str, np.ndarray] | None) -> list[str]:
        """Place the envs and start (or, from ``saved``, continue) their episodes; returns notes."""
        self.chunk_for(policy)
        spec = algo.rollout_spec()
        self._spec_rollout, self._rank, self._world = spec, rank, world
        num_envs = spec.groups * spec.group_size if spec.kind == "episodes" else int(self.cfg.num_envs)
        if spec.kind == "episodes" and spec.group_size > 1 and not self.spec.per_env_seeds:
            raise UserError(f"--algo {algo.name} compares groups of episodes that start from one seed, but this "
                            f"simulator seeds its whole batch at once (EnvSpec.per_env_seeds=False, a batched engine "
                            f"such as Isaac Lab): its groups would not share initial states. Use --algo ppo")
        executor = self.executor(policy_actor(policy, self.spec, self.ctx.device, False), num_envs)
        first_seeds = training_seeds(int(self.cfg.seed), state["iteration"] * world + rank, num_envs)
        overlap = bool((self.cfg.get("runtime") or {}).get("overlap_update", False)) and spec.kind == "steps"
        notes = self._start_normalizer(num_envs, saved is not None or state["iteration"] > 0, overlap, algo)
        if self.normalizer is not None:
            if overlap:
                raise UserError("runtime.overlap_update=true collects in another process, which cannot share the running "
                                "normalization statistics; set runtime.overlap_update=false or env.normalize_obs/"
                                "normalize_reward=false")
            if saved is not None and "norm_returns" in saved and len(saved["norm_returns"]) == num_envs:
                self.normalizer.returns[:] = saved["norm_returns"]
            if world > 1:
                self.normalizer.track_ranks()
        if saved is not None and "recent" in saved:
            self.recent = [EpisodeStats(float(r), int(n), bool(s), bool(e)) for r, n, s, e in saved["recent"]]
        if overlap:  # the next rollout is collected in another process during the update
            from rlinf_cli.runtime.overlap import OverlappedRunner

            runtime = runtime_options(self.cfg)
            start_it = state["iteration"]
            self.runner = OverlappedRunner(
                self.sim, policy, num_envs, int(self.cfg.seed) + 1, lambda i: first_seeds if i == start_it else None,
                start_iteration=start_it, start_method=str(runtime.get("start_method", "forkserver")),
                executor=None if runtime.get("mode", "collocated") == "collocated"
                else (type(executor), {**dict(plain(self.cfg.executor)), "runtime": runtime}))
            self._env = self.runner
            return notes + ["runtime: rollouts overlap the update in a separate process (one policy version behind)"]
        with under_way(self.ctx.log, f"starting {num_envs:,} envs", bool(self.cfg.get("progress", True))):
            self._env = executor.make_vec_env(self.sim, num_envs, autoreset=spec.kind != "episodes")
            notes.append(f"runtime: {executor.describe()}")
            if spec.kind == "transitions":
                notes += self._start_replay(policy, spec, saved)
            if spec.kind in ("steps", "transitions"):
                self.runner = Runner(self._env, policy, self.ctx.device, self.normalizer)
                if saved is not None and "streams" in saved and self.spec.replayable:
                    self.runner.restore(saved)
                else:
                    if saved is not None or state["iteration"] > 0:
                        notes.append("resume: the simulator's episodes cannot be replayed (EnvSpec.replayable=False or "
                                     "no saved env state); the resumed run starts fresh episodes")
                    self.runner.reset(first_seeds)
        return notes

    def collect(self, policy: Any, algo: Algorithm, iteration: int) -> Experience:
        spec = self._spec_rollout
        if spec.kind == "steps":
            exp = self.runner.collect_steps(spec.steps)
        elif spec.kind == "transitions":
            warm = self.replay.added < spec.warmup_steps
            exp = self.runner.collect_steps(spec.steps, sink=self._add_transitions,
                                            explore=self._random_actions if warm else None)
            exp.stats["replay_size"] = float(len(self.replay))
        elif spec.kind == "episodes":
            exp = self._collect_groups(policy, algo, iteration)
        else:
            raise UserError(f"algorithm '{algo.name}' learns from rollout='{spec.kind}', which `rlinf rl` cannot "
                            f"collect on an embodied simulator yet")
        if self.normalizer is not None and self._world > 1:
            self.normalizer.sync()  # every rank's new observations, merged: the same statistics everywhere
        self.recent = (self.recent + exp.episodes)[-100:]
        return exp

    # -- transitions (off-policy) ----------------------------------------------------------------
    def _start_replay(self, policy: Any, spec: Any, saved: dict[str, np.ndarray] | None) -> list[str]:
        """The replay buffer (restored from ``saved``) and the demonstrations of ``demos=``."""
        from rlinf_cli.runtime.replay import ReplayBuffer

        keys = [k for k in policy.observation_keys]
        self.replay = ReplayBuffer(self.spec, keys, spec.buffer_size)
        self._rng = np.random.default_rng([int(self.cfg.seed), self._rank, 17])  # warm-up actions
        notes = [f"replay buffer: {spec.buffer_size:,} transitions, {self.replay.nbytes / 2**20:,.0f} MiB"]
        if saved is not None:
            if self.replay.load(saved):
                if "replay_rng" in saved:  # the warm-up's random actions continue their stream
                    self._rng = _rng_from(saved["replay_rng"])
                notes.append(f"replay buffer restored: {len(self.replay):,} transitions")
            else:
                notes.append("resume: the checkpoint holds no replay buffer; it refills from the resumed run")
        self.demos = None
        source = self.cfg.get("demos")
        if source:
            self.demos = demo_buffer(str(source), self.spec, keys)
            notes.append(f"demonstrations: {len(self.demos):,} transitions from {source}; "
                         f"{spec.demo_fraction:.0%} of every batch")
            if spec.demo_fraction <= 0:
                raise UserError(f"demos={source} is given but the algorithm draws no share of its batches from "
                                f"demonstrations (algo.demo_fraction=0); set it, e.g. algo.demo_fraction=0.5")
        return notes

    def _random_actions(self, obs: Any) -> np.ndarray:
        return random_actor(self.spec, self._rng)(obs)[1]

    def _add_transitions(self, obs: Any, actions: np.ndarray, sb: StepBatch) -> None:
        nxt = sb.obs
        ended = sb.terminated | sb.truncated
        if sb.final_obs is not None and ended.any():  # the env auto-reset: the transition ends in the final obs
            nxt = {k: np.where(ended.reshape(-1, *([1] * (nxt[k].ndim - 1))), sb.final_obs[k], nxt[k])
                   for k in self.replay.keys}
        self.replay.add(obs, actions, sb.reward, nxt, sb.terminated)

    def collected(self) -> int:
        """Transitions this rank has added to its replay buffer (restored on resume)."""
        return int(self.replay.added)

    def sample(self, algo: Algorithm, generator: torch.Generator) -> Any:
        """One :class:`TransitionBatch`: ``batch_size`` transitions, ``demo_fraction`` of them from
        the demonstrations (RLPD's symmetric sampling), normalized by the current statistics."""
        from rlinf_cli.algorithm import TransitionBatch
        from rlinf_cli.policy import obs_to_torch

        spec = self._spec_rollout
        n_demo = int(round(spec.batch_size * spec.demo_fraction)) if self.demos is not None else 0
        parts = [self.replay.sample(spec.batch_size - n_demo, generator)]
        if n_demo:
            parts.append(self.demos.sample(n_demo, generator))
        cat = (lambda key: np.concatenate([p[key] for p in parts])) if n_demo else (lambda key: parts[0][key])
        obs = {k: np.concatenate([p["obs"][k] for p in parts]) for k in parts[0]["obs"]}
        nxt = {k: np.concatenate([p["next_obs"][k] for p in parts]) for k in parts[0]["next_obs"]}
        rewards = cat("rewards")
        if self.normalizer is not None:
            obs, nxt = self.normalizer.observe(obs, update=False), self.normalizer.observe(nxt, update=False)
            rewards = self.normalizer.scale_rewards(rewards)
        dev = self.ctx.device
        demo = (np.arange(spec.batch_size) >= spec.batch_size - n_demo).astype(np.float32)  # the last n_demo rows
        f = lambda x: torch.as_tensor(np.asarray(x, np.float32), device=dev)  # noqa: E731
        return TransitionBatch(obs_to_torch(obs, dev), torch.as_tensor(cat("actions"), device=dev), f(rewards),
                               obs_to_torch(nxt, dev), f(cat("terminated")), f(demo))

    def _collect_groups(self, policy: Any, algo: Algorithm, iteration: int) -> Experience:
        spec = self._spec_rollout
        seeds = training_seeds(int(self.cfg.seed), iteration * self._world + self._rank, spec.groups)
        recorder = EpisodeRecorder()
        norm = self.normalizer  # group rollouts: observations only (a group compares whole-episode returns)
        transform = (lambda o: norm.observe(o, True)) if norm is not None else None
        episodes = run_episodes(self._env, policy_actor(policy, self.spec, self.ctx.device, False),
                                [s for s in seeds for _ in range(spec.group_size)], recorder, transform=transform)
        exp = recorder.to_experience(episodes, spec.group_size, self.ctx.device)
        keep = algo.filter_groups(exp.episode_returns)
        if keep is not None:  # dropped groups stay in the batch with no weight
            exp.mask = exp.mask * keep.repeat_interleave(spec.group_size).to(exp.mask).unsqueeze(0)
        return exp

    def epochs(self, exp: Experience, adv: torch.Tensor, ret: torch.Tensor, algo: Algorithm,
               generator: torch.Generator) -> Iterator[Iterable[MiniBatch]]:
        """One iterable of minibatches per epoch: the valid samples, shuffled. One gather per
        tensor per epoch, then contiguous slices (cheap at thousands of tiny steps)."""
        obs, actions, data = self._flatten(exp, adv, ret)
        n = actions.shape[0]
        size = min(algo.minibatch_size, n)

        def epoch() -> Iterator[MiniBatch]:
            perm = torch.randperm(n, generator=generator)
            e_obs = {k: v[perm.numpy()] if isinstance(v, np.ndarray) else v[perm] for k, v in obs.items()}
            e_actions = actions[perm]
            e_data = [None if t is None else t[perm] for t in data]
            for start in range(0, n, size):
                sl = slice(start, start + size)
                yield MiniBatch(*(None if t is None else t[sl] for t in e_data),
                                obs={k: v[sl] for k, v in e_obs.items()}, actions=e_actions[sl])

        for _ in range(algo.epochs if n else 0):
            yield epoch()

    def _flatten(self, exp: Experience, adv: torch.Tensor, ret: torch.Tensor
                 ) -> tuple[dict[str, torch.Tensor], torch.Tensor, list[torch.Tensor | None]]:
        valid = exp.mask.reshape(-1) > 0
        keep_all = bool(valid.all())

        def flat(x: Any) -> Any:
            if x is None:
                return None
            x = x.reshape(-1, *x.shape[2:])
            if keep_all:
                return x
            return x[valid.cpu().numpy()] if isinstance(x, np.ndarray) else x[valid]  # text entries: numpy

        data = [flat(exp.logprobs), flat(adv), flat(ret), flat(exp.values), None, flat(exp.ref_logprobs)]
        return {k: flat(v) for k, v in exp.obs.items()}, flat(exp.actions), data

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

    def state(self) -> dict[str, np.ndarray]:
        """What a checkpoint needs to continue exactly: running episodes (replayed on resume) and
        the recent episodes behind ``rollout/return_mean_100``."""
        out = dict(self.runner.state()) if isinstance(self.runner, Runner) else {}
        out["recent"] = np.array([[e.ret, e.length, e.success_once, e.success_at_end] for e in self.recent],
                                 dtype=np.float64).reshape(-1, 4)
        if self.normalizer is not None and not self.normalizer.frozen:
            out["norm_returns"] = self.normalizer.returns.copy()  # this rank's running discounted returns
        if getattr(self, "replay", None) is not None:
            out.update(self.replay.state())
            out["replay_rng"] = _rng_state(self._rng)
        return out

    def save_files(self, directory: Any) -> None:
        """Files a checkpoint holds besides the policy (rank 0 writes them): the normalization statistics."""
        if self.normalizer is not None:
            self.normalizer.save(directory)

    def close(self) -> None:
        if self._env is not None:
            self._env.close()
            self._env = None

    # -- evaluation -------------------------------------------------------------------------
    def run_episodes(self, act: Callable, episodes: int, seed: int, num_envs: int,
                     recorder_factory: Callable[[], Recorder] | None = None,
                     on_batch: Callable[[list[EpisodeStats]], None] | None = None,
                     sim: Simulator | None = None) -> list[EpisodeStats]:
        """Episodes ``seed, seed+1, ...`` in batches of ``num_envs``; returns them in seed order.
        ``sim``: another simulator to run them on (the same one with a video camera)."""
        if episodes < 1:
            return []
        n = max(1, min(num_envs, episodes))
        env = self.executor(act, n).make_vec_env(sim or self.sim, n, autoreset=False)
        results: list[EpisodeStats] = []
        try:
            for start in range(0, episodes, n):
                seeds = [seed + start + i for i in range(n)]
                batch = run_episodes(env, act, seeds, recorder_factory() if recorder_factory else None)[: episodes - start]
                results.extend(batch)
                if on_batch is not None:
                    on_batch(batch)
        finally:
            env.close()
        return results

    def check_video(self, video: int, size: int) -> None:
        """Fail now, not after training, when ``video`` > 0 and this simulator cannot render."""
        if video:
            from rlinf_cli.collectors.videos import video_source

            video_source(self.sim, size)

    def evaluate(self, policy: Any, episodes: int, seed: int, deterministic: bool = True, label: str = "policy",
                 on_batch: Callable[[int], None] | None = None, video: int = 0, video_dir: Any = None,
                 video_size: int = 256, **_text: Any) -> Evaluation:
        """``episodes`` held-out episodes (seeds ``seed, seed+1, ...``) of ``policy`` (a Policy,
        or ``random`` / ``expert`` / a checkpoint path); the first ``video`` recorded to mp4 files in
        ``video_dir`` (``extra["videos"]``)."""
        from rlinf_cli.collectors.videos import evaluate_with_video

        if not isinstance(policy, str):
            self.chunk_for(policy)
        act = self.actor(policy, deterministic, seed) if isinstance(policy, str) else \
            self._policy_actor(policy, deterministic)
        eps, files = evaluate_with_video(self, act, episodes, seed, int(self.cfg.get("num_envs", 8)), video,
                                         video_dir, video_size, on_batch=(lambda b: on_batch(len(b))) if on_batch else None)
        summary = summarize(eps, self.spec.has_success)
        rows = {label: summary}
        extra: dict[str, Any] = {"per_episode": [e.__dict__ for e in eps]}
        if files:
            extra["videos"] = [str(f) for f in files]
        metrics = {f"eval/{k}": v for k, v in summary.items()}
        if len(self.spec.tasks) > 1 and eps:  # multi-task: one row per task, then the mean over tasks
            per_task = summarize_by_task(eps, self.spec.tasks, self.spec.has_success)
            mean = task_mean(per_task)
            extra.update(per_task=per_task, task_mean=mean)
            rows = {f"{label} · {task}": s for task, s in per_task.items()}
            rows[f"{label} · mean over {len(per_task)} tasks"] = mean
            metrics.update({f"eval/task/{task}/{k}": v for task, s in per_task.items() for k, v in s.items()})
            metrics.update({f"eval/task_mean/{k}": v for k, v in mean.items()})
        told = instructions_by_row(eps, rows, label, self.spec.tasks)
        if told:
            extra["instructions"] = told
        return Evaluation(summary, rows, metrics, extra)

    def table(self, rows: dict[str, dict[str, float]], title: str, instructions: dict[str, str] | None = None) -> Any:
        return eval_table(rows, title, instructions)

    # -- datasets (sft) and demonstrations (collect) ----------------------------------------------
    def dataset(self, path: str, val_fraction: float, seed: int) -> Any:
        from rlinf_cli.collectors.datasets import EpisodeDataset

        return EpisodeDataset(path, val_fraction, seed, self.ctx.device, (self.cfg.get("lerobot") or {}).get("features"))

    def writer(self, output: str, provenance: dict[str, Any], chunk: int) -> Any:
        """The dataset writer ``format`` names: rlinf's own, or LeRobot v3.0 (rlinf_cli/data/lerobot.py)."""
        from rlinf_cli.data.dataset import DatasetWriter
        from rlinf_cli.data.lerobot_writer import writer_for

        if self.cfg.get("format", "rlinf") == "lerobot":
            writer = writer_for(self.cfg, self.sim, provenance)
        else:
            writer = DatasetWriter(output, self.spec, provenance, chunk)
        # appending continues after every seed tried before (kept or dropped by only_success)
        writer.provenance["first_seed"] = writer.seed_after(int(self.cfg.seed) + writer.episodes_written)
        return writer

    def record(self, writer: Any, source: str, want: int, only_success: bool, progress: Any) -> list[Any]:
        """Run ``source`` (random, expert or a checkpoint; with ``action_noise`` / ``epsilon``) on
        fresh seeds and append the episodes it keeps to ``writer`` until ``want`` are kept."""
        from rlinf_cli.collectors.datasets import EpisodeBuffer, with_noise
        from rlinf_cli.runtime.chunking import ChunkedSimulator

        cfg, first_seed = self.cfg, writer.provenance["first_seed"]
        actor = self.actor(source, bool(cfg.deterministic), int(cfg.seed))
        if isinstance(self.sim, ChunkedSimulator):
            raise UserError(f"'{source}' acts in chunks of {self.sim.k} actions: datasets hold one action per step, "
                            "so collect demonstrations with policy=expert or a one-step policy")
        act = with_noise(actor, self.spec, float(cfg.action_noise), float(cfg.epsilon),
                         np.random.default_rng(int(cfg.seed)))
        n = max(1, min(int(cfg.num_envs), want))
        env = self.executor(act, n).make_vec_env(self.sim, n, autoreset=False)
        kept: list[Any] = []
        tried = 0
        try:
            while len(kept) < want:
                if tried >= 20 * want:
                    self.ctx.note(f"stopping: {tried} episodes tried, {len(kept)} kept "
                                  f"(only_success=true and the policy rarely succeeds)")
                    break
                seeds = [first_seed + tried + i for i in range(n)]
                buf = EpisodeBuffer(n)
                stats = run_episodes(env, act, seeds, buf)
                tried += n
                writer.next_seed = first_seed + tried
                for i, st in enumerate(stats):
                    if len(kept) >= want or (only_success and not st.success_once):
                        continue
                    kept.append(buf.episode(i, seeds[i]))
                    writer.add(kept[-1])
                    progress.update(1, (f"success {np.mean([e.success.any() for e in kept]):.0%}  "
                                        if self.spec.has_success else "")
                                    + f"return {np.mean([e.rewards.sum() for e in kept]):.1f}")
        finally:
            env.close()
        return kept

    def demos_summary(self, kept: Sequence[Any]) -> dict[str, float]:
        return summarize([EpisodeStats(float(e.rewards.sum()), len(e), bool(e.success.any()), bool(e.success[-1]))
                          for e in kept], self.spec.has_success)

    def describe(self) -> str:
        return self.label
