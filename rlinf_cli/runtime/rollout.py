"""Rollouts: a policy driving a vectorised env.

Two shapes of experience, both come out as an :class:`~rlinf_cli.experience.Experience`:

- :meth:`Runner.collect_steps`: T steps from continuing, auto-resetting envs (PPO). Truncated
  episodes are bootstrapped with the value of their final observation.
- :func:`run_episodes`: one whole episode per env from given seeds, envs not auto-reset
  (GRPO groups, evaluation, dataset collection). A recorder sees every step.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Protocol, Sequence

import numpy as np
import torch

from rlinf_cli.api import TASK_KEY, EnvSpec, Obs, StepBatch, VecEnv
from rlinf_cli.experience import Experience
from rlinf_cli.policy import Policy, obs_to_torch


@dataclass
class EpisodeStats:
    ret: float
    length: int
    success_once: bool  # the task was solved at some step of the episode
    success_at_end: bool  # the task was solved at the episode's last step
    seed: int | None = None
    task: int | None = None  # multi-task simulators: index into EnvSpec.tasks (from the obs key "task_id")
    instruction: str | None = None  # the episode's first text observation (a task instruction), if the spec has one


def env_action(spec: EnvSpec, action: torch.Tensor) -> np.ndarray:
    """Policy action -> what the env accepts (continuous actions clipped to the bounds)."""
    a = action.detach().cpu().numpy()
    if not spec.discrete and spec.action.low is not None and spec.action.high is not None:
        # np.clip's Python wrapper costs ~20 us per call; the two ufuncs give the same result
        a = np.minimum(np.maximum(a, spec.action.low), spec.action.high)
    return a


class EpisodeTracker:
    """Running return/length/success per env for auto-resetting rollouts."""

    def __init__(self, n: int):
        self.ret = np.zeros(n, dtype=np.float64)
        self.length = np.zeros(n, dtype=np.int64)
        self.success = np.zeros(n, dtype=bool)

    def state(self) -> dict[str, np.ndarray]:
        return {"ret": self.ret.copy(), "length": self.length.copy(), "success": self.success.copy()}

    def load(self, state: dict[str, np.ndarray]) -> None:
        self.ret[:] = state["ret"]
        self.length[:] = state["length"]
        self.success[:] = state["success"]

    def update(self, sb: StepBatch, lo: int = 0) -> list[EpisodeStats]:
        """Account one step of envs ``lo .. lo + len(sb.reward) - 1``; returns the episodes that ended."""
        hi = lo + len(sb.reward)
        ret, length, success = self.ret[lo:hi], self.length[lo:hi], self.success[lo:hi]
        ret += sb.reward
        length += 1
        success |= sb.success
        ended = np.flatnonzero(sb.terminated | sb.truncated)
        finished = [EpisodeStats(float(ret[i]), int(length[i]), bool(success[i]), bool(sb.success[i])) for i in ended]
        ret[ended] = 0.0
        length[ended] = 0
        success[ended] = False
        return finished


class Runner:
    """Collects fixed-length rollouts from an auto-resetting VecEnv.

    It also keeps what a checkpoint needs to continue the running episodes exactly: each env's
    seed stream and episode index, and the actions it took since its episode began (see
    :meth:`state` and :meth:`restore`; the env replays them).
    """

    # an env whose episode never ends would grow its action log without bound: past this many
    # steps it is not logged, and a resume starts that env on a fresh episode instead
    MAX_REPLAY_STEPS = 100_000

    def __init__(self, env: VecEnv, policy: Policy, device: torch.device | str = "cpu", normalizer: Any = None):
        self.env = env
        self.policy = policy
        self.device = torch.device(device)
        # running obs/reward normalization (rlinf_cli/runtime/normalize.py): the policy acts on,
        # and the experience holds, normalized observations and scaled rewards; the episode
        # statistics and the action logs stay in the env's own units
        self.normalizer = normalizer
        self.spec = env.spec
        self.obs: Obs | None = None
        n = env.num_envs
        self.tracker = EpisodeTracker(n)
        self.streams = np.zeros(n, dtype=np.int64)
        self.episodes = np.zeros(n, dtype=np.int64)
        self._actions: list[list[np.ndarray]] = [[] for _ in range(n)]  # env actions since each episode began
        self._sink: Callable[..., None] | None = None
        self._explore: Callable[[Obs], np.ndarray] | None = None

    def reset(self, seeds: Sequence[int]) -> None:
        self.obs = self.env.reset(seeds)
        n = self.env.num_envs
        self.tracker = EpisodeTracker(n)
        self.streams[:] = seeds
        self.episodes[:] = 0
        self._actions = [[] for _ in range(n)]

    def state(self) -> dict[str, np.ndarray]:
        """Arrays that let :meth:`restore` continue every env's running episode exactly."""
        logs = [np.concatenate(chunks) if chunks else np.zeros((0, *self.spec.action.shape), self._action_dtype())
                for chunks in self._actions]
        lengths = np.array([len(a) for a in logs], dtype=np.int64)
        actions = np.zeros((len(logs), int(lengths.max(initial=0)), *self.spec.action.shape), self._action_dtype())
        for i, a in enumerate(logs):
            actions[i, :len(a)] = a
        lengths[self.tracker.length > self.MAX_REPLAY_STEPS] = -1  # not replayable: restore starts it anew
        return {"streams": self.streams.copy(), "episodes": self.episodes.copy(), "actions": actions,
                "action_lengths": lengths, **self.tracker.state()}

    def restore(self, state: dict[str, np.ndarray]) -> None:
        """Continue from :meth:`state` of a run with the same envs (replays the logged actions)."""
        n = self.env.num_envs
        if len(state["streams"]) != n:
            raise ValueError(f"the saved env state has {len(state['streams'])} envs, this run {n}")
        lengths = state["action_lengths"]
        fresh = lengths < 0  # an env past MAX_REPLAY_STEPS: starts its next episode instead
        episodes = state["episodes"] + fresh
        logs = [state["actions"][i, :max(int(lengths[i]), 0)] for i in range(n)]
        self.obs = self.env.restore([int(x) for x in state["streams"]], [int(k) for k in episodes], logs)
        self.streams[:] = state["streams"]
        self.episodes[:] = episodes
        self._actions = [[a.copy()] if len(a) else [] for a in logs]
        self.tracker.load(state)
        self.tracker.length[fresh] = 0
        self.tracker.ret[fresh] = 0.0
        self.tracker.success[fresh] = False

    def _action_dtype(self) -> Any:
        return np.int64 if self.spec.discrete else np.float32

    def _log_actions(self, actions: torch.Tensor, dones: torch.Tensor) -> None:
        """Account one rollout ([T, N]) in the per-env action logs and episode indices."""
        sent = env_action(self.spec, actions)  # what the envs received
        ended = dones.cpu().numpy() > 0
        for i in range(sent.shape[1]):
            d = np.flatnonzero(ended[:, i])
            if d.size:
                self.episodes[i] += d.size
                self._actions[i] = [sent[d[-1] + 1:, i].copy()]
            else:
                self._actions[i].append(sent[:, i].copy())
            if self.tracker.length[i] > self.MAX_REPLAY_STEPS:
                self._actions[i] = []  # too long to replay; state() marks it

    @torch.no_grad()
    def collect_steps(self, num_steps: int, sink: Callable[..., None] | None = None,
                      explore: Callable[[Obs], np.ndarray] | None = None) -> Experience:
        """``num_steps`` steps of every env, laid out [T, N].

        When the env exposes pipeline groups (``runtime.mode=hybrid``), each group is stepped
        on its own: the policy acts on group g as soon as its observations arrive, while the
        workers still simulate the other groups. The layout and bookkeeping are the same.

        ``transitions`` rollouts: ``sink(obs, env_actions, sb)`` receives every step of every env
        group in the env's own units (raw observations and rewards, ``sb.final_obs`` where an
        episode ended); ``explore(obs) -> env actions`` replaces the policy (random warm-up).
        """
        assert self.obs is not None, "call reset() first"
        self._sink, self._explore = sink, explore
        n, dev = self.env.num_envs, self.device
        buf = _StepBuffers(self.spec, num_steps, n, dev)
        groups = getattr(self.env, "pipeline_groups", None)
        if groups and len(groups) > 1 and hasattr(self.env, "step_group_async"):
            self._collect_pipelined(num_steps, buf, groups)
        else:
            self._collect_sync(num_steps, buf)
        self._log_actions(buf.actions, buf.dones)
        last_value = self.policy.get_value(obs_to_torch(self._seen(self.obs), dev)) if self.policy.has_critic \
            else torch.zeros(n, device=dev)
        stats = buf.stats
        for key in [k for k in stats if k.startswith("transport/obs_bytes")]:
            stats[key + "_per_step"] = stats[key] / num_steps
        return Experience(buf.obs, buf.actions, buf.logprobs, buf.values, buf.rewards, buf.dones, buf.trunc_values,
                          torch.ones((num_steps, n), device=dev), last_value, episodes=buf.episodes,
                          env_steps=num_steps * n, stats=stats)

    def _seen(self, obs: Obs, update: bool = False) -> Obs:
        """What the policy sees of ``obs`` (normalized when the run normalizes observations)."""
        return obs if self.normalizer is None else self.normalizer.observe(obs, update)

    def _act(self, buf: "_StepBuffers", t: int, obs: Obs, lo: int, hi: int) -> np.ndarray:
        if self._explore is not None:  # warm-up: no policy (log-probs and values stay 0)
            self._seen(obs, update=True)  # the statistics still see what the envs show
            a = self._explore(obs)
            buf.actions[t, lo:hi] = torch.from_numpy(np.asarray(a))
            return a
        obs = self._seen(obs, update=True)
        o = obs_to_torch(obs, self.device)
        out = self.policy.act(o)
        if buf.np is not None:  # CPU: write through numpy views (a fraction of a torch index-put's cost)
            for k, v in obs.items():
                buf.np["obs"][k][t, lo:hi] = v
            for name, v in (("actions", out.action), ("logprobs", out.logprob), ("values", out.value)):
                buf.np[name][t, lo:hi] = v.numpy()
        else:
            for k, v in o.items():
                buf.obs[k][t, lo:hi] = v  # text entries are numpy object arrays on every device
            buf.actions[t, lo:hi] = out.action
            buf.logprobs[t, lo:hi] = out.logprob
            buf.values[t, lo:hi] = out.value
        for k, v in (getattr(out, "extras", None) or {}).items():  # evaluate reads them back from obs
            buf.extra(k, v)[t, lo:hi] = v.detach().to(buf.actions.device)
        return env_action(self.spec, out.action)

    def _record(self, buf: "_StepBuffers", t: int, sb: StepBatch, lo: int, hi: int) -> None:
        ended = sb.terminated | sb.truncated
        reward = sb.reward if self.normalizer is None else self.normalizer.reward(sb.reward, ended, lo)
        if buf.np is not None:
            buf.np["rewards"][t, lo:hi] = reward
            buf.np["dones"][t, lo:hi] = ended
        else:
            buf.rewards[t, lo:hi] = torch.from_numpy(reward)
            buf.dones[t, lo:hi] = torch.from_numpy(ended.astype(np.float32))
        cut = sb.truncated & ~sb.terminated
        if self.policy.has_critic and cut.any():
            mask = torch.from_numpy(cut.astype(np.float32)).to(self.device)
            if sb.final_obs is not None:
                v_final = self.policy.get_value(obs_to_torch(self._seen(sb.final_obs), self.device))
            else:
                # a batched engine that reset the env without reporting its final observation
                # (Isaac Lab): bootstrap from the value of the observation before the last step
                v_final = buf.values[t, lo:hi]
            buf.trunc_values[t, lo:hi] = v_final * mask
        buf.episodes.extend(self.tracker.update(sb, lo))
        for k, v in sb.stats.items():
            buf.stats[k] = buf.stats.get(k, 0.0) + v

    def _collect_sync(self, num_steps: int, buf: "_StepBuffers") -> None:
        obs, n = self.obs, self.env.num_envs
        for t in range(num_steps):
            action = self._act(buf, t, obs, 0, n)
            sb = self.env.step(action)
            self._record(buf, t, sb, 0, n)
            if self._sink is not None:
                self._sink(obs, action, sb)
            obs = sb.obs
        self.obs = obs

    def _collect_pipelined(self, num_steps: int, buf: "_StepBuffers", groups: Sequence[tuple[int, int]]) -> None:
        env = self.env
        obs = [{k: v[lo:hi] for k, v in self.obs.items()} for lo, hi in groups]
        sent: list[np.ndarray] = []
        for g, (lo, hi) in enumerate(groups):
            sent.append(self._act(buf, 0, obs[g], lo, hi))
            env.step_group_async(g, sent[g])
        for t in range(num_steps):
            for g, (lo, hi) in enumerate(groups):
                sb = env.step_group_wait(g)
                self._record(buf, t, sb, lo, hi)
                if self._sink is not None:
                    self._sink(obs[g], sent[g], sb)
                obs[g] = sb.obs
                if t + 1 < num_steps:  # act on this group while the others are still simulated
                    sent[g] = self._act(buf, t + 1, obs[g], lo, hi)
                    env.step_group_async(g, sent[g])
        self.obs = {k: np.concatenate([o[k] for o in obs]) for k in self.obs}


class _StepBuffers:
    """Preallocated [T, N] tensors a rollout is written into."""

    def __init__(self, spec: EnvSpec, num_steps: int, n: int, dev: torch.device):
        # torch names its dtypes as numpy does ("float32", "uint8", "bool", ...)
        self.obs = {k: np.full((num_steps, n), "", dtype=object) if s.is_text else
                    torch.zeros((num_steps, n, *s.shape), dtype=getattr(torch, s.dtype), device=dev)
                    for k, s in spec.observation.items()}
        act_dtype = torch.int64 if spec.discrete else torch.float32
        self.actions = torch.zeros((num_steps, n, *spec.action.shape), dtype=act_dtype, device=dev)
        self.logprobs, self.values, self.rewards, self.dones, self.trunc_values = (
            torch.zeros((num_steps, n), device=dev) for _ in range(5))
        self.episodes: list[EpisodeStats] = []
        self.stats: dict[str, float] = {}
        self._extras: set[str] = set()
        # numpy views of the CPU buffers (they share memory with the tensors)
        self.np: dict[str, Any] | None = None
        if dev.type == "cpu":
            self.np = {"obs": {k: v if isinstance(v, np.ndarray) else v.numpy() for k, v in self.obs.items()},
                       "actions": self.actions.numpy(),
                       "logprobs": self.logprobs.numpy(), "values": self.values.numpy(),
                       "rewards": self.rewards.numpy(), "dones": self.dones.numpy()}

    def extra(self, key: str, like: torch.Tensor) -> torch.Tensor:
        """The [T, N, ...] buffer of a policy's acting extra (``ActOutput.extras``), kept among the
        observations so that minibatches carry it to ``evaluate``; made on its first write."""
        if key in self.obs and key not in self._extras:
            raise ValueError(f"the policy's acting extra '{key}' has the name of an observation entry")
        if key not in self._extras:
            self._extras.add(key)
            self.obs[key] = torch.zeros((*self.actions.shape[:2], *like.shape[1:]), dtype=like.dtype,
                                        device=self.actions.device)
        return self.obs[key]


class Recorder(Protocol):
    def __call__(self, t: int, obs: Obs, out: Any, action: np.ndarray, sb: StepBatch, alive: np.ndarray) -> None: ...


def run_episodes(
    env: VecEnv,
    act: Callable[[Obs], tuple[Any, np.ndarray]],
    seeds: Sequence[int],
    recorder: Recorder | None = None,
    max_steps: int | None = None,
    transform: Callable[[Obs], Obs] | None = None,
) -> list[EpisodeStats]:
    """Run one episode per env (``env`` must not auto-reset); returns per-env stats in env order.

    ``act(obs) -> (policy_output, env_action)``. Episodes still running after ``max_steps``
    (default: the spec's ``max_episode_steps``) count as truncated. ``transform(obs)``: what the
    policy and the recorder see instead of the env's observations (running normalization).
    """
    n = env.num_envs
    obs = env.reset(seeds)
    # Simulators with several tasks say in the observation which task each env runs.
    tasks = np.asarray(obs[TASK_KEY]).reshape(n).copy() if TASK_KEY in obs else None
    # ... and language-conditioned ones what each env was told (evaluation tables show it)
    text_key = next((k for k, s in env.spec.observation.items() if s.is_text and k in obs), None)
    texts = [str(x) for x in np.asarray(obs[text_key], dtype=object).reshape(n)] if text_key else None
    alive = np.ones(n, dtype=bool)
    ret = np.zeros(n)
    length = np.zeros(n, dtype=np.int64)
    success_once = np.zeros(n, dtype=bool)
    success_last = np.zeros(n, dtype=bool)
    limit = max_steps or env.spec.max_episode_steps
    for t in range(limit):
        seen = obs if transform is None else transform(obs)
        out, action = act(seen)
        sb = env.step(action)
        if recorder is not None:
            recorder(t, seen, out, action, sb, alive.copy())
        ret += np.where(alive, sb.reward, 0.0)
        length += alive
        success_once |= sb.success & alive
        success_last = np.where(alive, sb.success, success_last)
        alive &= ~(sb.terminated | sb.truncated)
        obs = sb.obs
        if not alive.any():
            break
    return [EpisodeStats(float(ret[i]), int(length[i]), bool(success_once[i]), bool(success_last[i]), int(seeds[i]),
                         None if tasks is None else int(tasks[i]), None if texts is None else texts[i])
            for i in range(n)]


def policy_actor(policy: Policy, spec: EnvSpec, device: torch.device | str, deterministic: bool) -> Callable:
    """``act`` function for :func:`run_episodes` from a policy."""
    dev = torch.device(device)

    @torch.no_grad()
    def act(obs: Obs) -> tuple[Any, np.ndarray]:
        out = policy.act(obs_to_torch(obs, dev), deterministic=deterministic)
        return out, env_action(spec, out.action)

    return act


class EpisodeRecorder:
    """Stores policy tensors for :func:`run_episodes`, to build a masked [T, N] Experience (GRPO)."""

    def __init__(self) -> None:
        self.obs: list[dict[str, Any]] = []
        self.actions: list[torch.Tensor] = []
        self.logprobs: list[torch.Tensor] = []
        self.values: list[torch.Tensor] = []
        self.rewards: list[np.ndarray] = []
        self.dones: list[np.ndarray] = []
        self.mask: list[np.ndarray] = []
        self.stats: dict[str, float] = {}

    def __call__(self, t: int, obs: Obs, out: Any, action: np.ndarray, sb: StepBatch, alive: np.ndarray) -> None:
        self.obs.append({k: v.copy() if v.dtype == object else torch.from_numpy(v) for k, v in obs.items()})
        for k, v in (getattr(out, "extras", None) or {}).items():  # evaluate reads them back from obs
            self.obs[-1][k] = v.detach().cpu()
        self.actions.append(out.action)
        self.logprobs.append(out.logprob)
        self.values.append(out.value)
        self.rewards.append(np.where(alive, sb.reward, 0.0).astype(np.float32))
        self.dones.append(((sb.terminated | sb.truncated) & alive).astype(np.float32))
        self.mask.append(alive.astype(np.float32))
        for k, v in sb.stats.items():
            self.stats[k] = self.stats.get(k, 0.0) + v

    def to_experience(self, episodes: list[EpisodeStats], group_size: int = 1,
                      device: torch.device | str = "cpu") -> Experience:
        dev = torch.device(device)
        keys = self.obs[0].keys()
        obs = {k: np.stack([o[k] for o in self.obs]) if isinstance(self.obs[0][k], np.ndarray)
               else torch.stack([o[k] for o in self.obs]).to(dev) for k in keys}
        rewards = torch.from_numpy(np.stack(self.rewards)).to(dev)
        mask = torch.from_numpy(np.stack(self.mask)).to(dev)
        return Experience(
            obs=obs,
            actions=torch.stack(self.actions).to(dev),
            logprobs=torch.stack(self.logprobs).to(dev),
            values=torch.stack(self.values).to(dev),
            rewards=rewards,
            dones=torch.from_numpy(np.stack(self.dones)).to(dev),
            trunc_values=torch.zeros_like(rewards),
            mask=mask,
            last_value=torch.zeros(rewards.shape[1], device=dev),
            episode_returns=torch.tensor([e.ret for e in episodes], dtype=torch.float32, device=dev),
            group_size=group_size,
            episodes=episodes,
            env_steps=int(mask.sum().item()),
            stats=dict(self.stats),
        )
