"""A vectorised env over a slice of env instances, stepped in this process.

Executors build on it: the local executor uses it directly (collocated) or inside worker
processes; the Ray executor inside actors. Observations are written into preallocated arrays,
so a step costs one Python call per env and no dict rebuilding.

Every episode starts from an explicit seed. ``reset(seeds)`` starts one *seed stream* per env;
with ``autoreset`` the k-th episode of stream s begins with ``reset(seed=episode_seed(s, k))``.
An env's state is therefore a function of (stream, k, actions since that episode began), which
is what a checkpoint saves and :meth:`SyncVecEnv.restore` replays to continue a run exactly.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from rlinf_cli.api import EnvSpec, Obs, Simulator, StepBatch
from rlinf_cli.errors import UserError

# Training seeds stay below this; evaluation seeds start at it (eval.seed), so they are held out.
TRAIN_SEED_SPACE = 1_000_000


def episode_seed(stream: int, k: int) -> int:
    """Seed of episode ``k`` of seed stream ``stream`` (episode 0 is the stream's own seed).

    Hashing (stream, k) rather than chaining seeds keeps streams apart: two envs whose seeds
    collide once do not share every later episode.
    """
    if k == 0:
        return int(stream)
    return int(np.random.SeedSequence([int(stream), int(k)]).generate_state(1)[0]) % TRAIN_SEED_SPACE


class ReplayError(UserError):
    """Replaying an episode's actions did not reproduce it: the simulator is not deterministic."""


def alloc_obs(spec: EnvSpec, n: int) -> Obs:
    """Arrays [n, ...] for a batch of observations (text entries: an object array of strings)."""
    return {k: np.full((n, *s.shape), "", dtype=object) if s.is_text else np.zeros((n, *s.shape), dtype=s.dtype)
            for k, s in spec.observation.items()}


def write_obs(dst: Obs, i: int, obs: Obs) -> None:
    for k, buf in dst.items():
        buf[i] = obs[k]


class SeededVecEnv:
    """What the runtime's VecEnvs share: last observations, each env's seed stream and episode index,
    and ``reset(seeds)`` as a :meth:`restore` of episode 0. ``restore`` calls the subclass's
    ``_restore(seeds, actions)``: env i starts with ``reset(seed=seeds[i])``, replays ``actions[i]``
    and writes its observation to ``_obs`` (WorkerVecEnv overrides ``restore`` instead)."""

    def __init__(self, spec: EnvSpec, num_envs: int, autoreset: bool):
        self.spec = spec
        self.num_envs = num_envs
        self.autoreset = autoreset
        self._obs = alloc_obs(spec, num_envs)  # last observation of every env
        self._done = np.zeros(num_envs, dtype=bool)  # autoreset=False: finished, waiting for reset()
        self._streams: list[int | None] = [None] * num_envs
        self._episodes = np.zeros(num_envs, dtype=np.int64)  # episode index within its stream

    def reset(self, seeds: Sequence[int | None]) -> Obs:
        if len(seeds) != self.num_envs:
            raise ValueError(f"reset needs {self.num_envs} seeds, got {len(seeds)}")
        return self.restore(seeds, [0] * self.num_envs, None)

    def restore(self, streams: Sequence[int | None], episodes: Sequence[int],
                actions: Sequence[np.ndarray] | None) -> Obs:
        """Env i starts episode ``episodes[i]`` of seed stream ``streams[i]`` and replays
        ``actions[i]`` ([L, *action_shape], the actions it took since that episode began)."""
        if len(streams) != self.num_envs or len(episodes) != self.num_envs:
            raise ValueError(f"restore needs {self.num_envs} streams and episode indices")
        self._restore([None if s is None else episode_seed(int(s), int(k)) for s, k in zip(streams, episodes)], actions)
        self._streams = [None if s is None else int(s) for s in streams]
        self._episodes[:] = episodes
        self._done[:] = False
        return self._copy_obs()

    def _copy_obs(self) -> Obs:
        return {k: v.copy() for k, v in self._obs.items()}


class SyncVecEnv(SeededVecEnv):
    """Steps ``len(indices)`` env instances one after another in this process."""

    def __init__(self, simulator: Simulator, indices: Sequence[int], autoreset: bool = True):
        self.indices = list(indices)
        super().__init__(simulator.spec, len(self.indices), autoreset)
        self.envs = [simulator.make_env(i) for i in self.indices]

    def _restore(self, seeds: list[int | None], actions: Sequence[np.ndarray] | None) -> None:
        for i, env in enumerate(self.envs):
            obs, _ = env.reset(seed=seeds[i])
            replay = actions[i] if actions is not None else ()
            for t, a in enumerate(replay):
                obs, _, term, trunc, _ = env.step(a)
                if term or trunc:  # the logged actions are of an episode still running
                    raise ReplayError(
                        f"replaying env {self.indices[i]}'s episode (seed {seeds[i]}) ended at "
                        f"step {t + 1} of {len(replay)}: this simulator is not deterministic given a seed and actions. "
                        f"Its plugin should set EnvSpec(replayable=False); resumed runs then start fresh episodes")
            write_obs(self._obs, i, obs)

    def step(self, actions: np.ndarray) -> StepBatch:
        n = self.num_envs
        reward = np.zeros(n, dtype=np.float32)
        terminated = np.zeros(n, dtype=bool)
        truncated = np.zeros(n, dtype=bool)
        success = np.zeros(n, dtype=bool)
        final_obs: Obs | None = None
        for i, env in enumerate(self.envs):
            if self._done[i]:  # autoreset=False: a finished env waits for reset()
                continue
            obs, r, term, trunc, info = env.step(actions[i])
            reward[i] = r
            terminated[i] = term
            truncated[i] = trunc
            success[i] = bool(info.get("success", False))
            if term or trunc:
                if self.autoreset:
                    if final_obs is None:
                        final_obs = alloc_obs(self.spec, n)
                    write_obs(final_obs, i, obs)
                    self._episodes[i] += 1
                    stream = self._streams[i]
                    obs, _ = env.reset(seed=None if stream is None else episode_seed(stream, int(self._episodes[i])))
                else:
                    self._done[i] = True
            write_obs(self._obs, i, obs)
        return StepBatch(self._copy_obs(), reward, terminated, truncated, success, final_obs)

    def close(self) -> None:
        for env in self.envs:
            env.close()
