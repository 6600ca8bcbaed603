"""Batched simulators (:class:`~rlinf_cli.api.BatchedSimulator`) as VecEnvs.

A batched simulator steps all its envs in one call of its own engine (Isaac Lab, ManiSkill on a
GPU). :class:`BatchedVecEnv` gives such a batch the :class:`~rlinf_cli.api.VecEnv` contract the
runners, executors and the env server already speak, so there is no second rollout path:

- executors step it in the driver process (``hosted_vec_env``), no env workers;
- the env server hosts one per session shard (``EnvWorker``), so a client's batched step is one
  request and one reply, observations compressed by the session's codec as for any env;
- ``make_env(i)`` of a batched simulator can be a :class:`SingleFromBatched` (a batch of one).

What the adapter adds to the engine's batch: numpy observations in the spec's dtypes (torch
tensors are converted once per step: a view on CPU, one device-to-host copy per key on an
accelerator), ``autoreset=False`` semantics (the engine resets finished envs itself; the adapter
hides them until the next ``reset``, as :class:`~rlinf_cli.runtime.vector.SyncVecEnv` does),
and the seed-stream bookkeeping resume reads. Engines reseed their own autoresets, so a batched
simulator's episodes are not a function of ``(stream, k)``: its spec says ``replayable=False``
and a resumed run starts fresh episodes (``restore`` with actions to replay refuses).
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np

from rlinf_cli.api import BatchedEnv, EnvSpec, Obs, StepBatch
from rlinf_cli.runtime.vector import ReplayError, SeededVecEnv, alloc_obs


def to_numpy(x: Any, dtype: Any = None) -> np.ndarray:
    """A numpy view (CPU) or copy (accelerator) of a batch entry; torch is never imported here."""
    if hasattr(x, "detach"):  # a torch tensor (.cpu() of a CPU tensor is the tensor itself)
        x = x.detach().cpu().numpy()
    a = np.asarray(x)
    return a if dtype is None or a.dtype == dtype else a.astype(dtype)


class BatchedVecEnv(SeededVecEnv):
    """A :class:`~rlinf_cli.api.VecEnv` over one :class:`~rlinf_cli.api.BatchedEnv`."""

    def __init__(self, spec: EnvSpec, env: BatchedEnv, autoreset: bool = True, indices: Sequence[int] | None = None):
        super().__init__(spec, int(env.num_envs), autoreset)
        self.env = env
        self.indices = list(indices) if indices is not None else list(range(self.num_envs))
        if len(self.indices) != self.num_envs:
            raise ValueError(f"the batched env has {self.num_envs} envs, {len(self.indices)} were asked for")
        self._dtypes = {k: (None if s.is_text else np.dtype(s.dtype)) for k, s in spec.observation.items()}

    def _store(self, obs: Mapping[str, Any], rows: np.ndarray | None = None) -> None:
        missing = [k for k in self._obs if k not in obs]
        if missing:
            raise KeyError(f"the batched env returned no observation {missing} (spec: {sorted(self._obs)}, "
                           f"got {sorted(obs)})")
        for k, buf in self._obs.items():
            a = to_numpy(obs[k], self._dtypes[k])
            if a.shape != buf.shape:
                raise ValueError(f"the batched env's obs['{k}'] has shape {a.shape}, expected {buf.shape}")
            if rows is None:
                buf[:] = a
            else:
                buf[rows] = a[rows]

    def _restore(self, seeds: list[int | None], actions: Sequence[np.ndarray] | None) -> None:
        if actions is not None and any(len(a) for a in actions):
            raise ReplayError("a batched simulator cannot replay episodes (its engine reseeds its own resets): its "
                              "spec should say replayable=False; resumed runs then start fresh episodes")
        self._store(self.env.reset(seeds))

    def step(self, actions: np.ndarray) -> StepBatch:
        n = self.num_envs
        obs, reward, term, trunc, info = self.env.step(np.asarray(actions))
        reward = to_numpy(reward, np.float32).reshape(n).copy()
        terminated = to_numpy(term, bool).reshape(n).copy()
        truncated = to_numpy(trunc, bool).reshape(n).copy()
        truncated &= ~terminated  # one reason per ended episode: termination wins
        success = to_numpy(info["success"], bool).reshape(n).copy() if "success" in info else np.zeros(n, bool)
        ended = terminated | truncated
        final_obs: Obs | None = None
        if self.autoreset:
            self._store(obs)
            if ended.any():
                self._episodes += ended
                if info.get("final_obs") is not None:
                    final_obs = alloc_obs(self.spec, n)
                    for k, buf in final_obs.items():
                        a = to_numpy(info["final_obs"][k], self._dtypes[k])
                        buf[ended] = a[ended]
        else:
            # finished envs keep running inside the engine (it reset them); their rows repeat the
            # last observation with zero reward and no flags until the next reset()
            hidden = self._done
            live = ~hidden
            if hidden.any():
                reward[hidden] = 0.0
                terminated[hidden] = truncated[hidden] = success[hidden] = False
                ended &= live
            fin = info.get("final_obs") if ended.any() else None
            # an env that just ended shows its final observation where the engine reports one
            # (else the first observation of the next episode, which the caller never acts on)
            self._store(obs, np.flatnonzero(live & ~ended) if fin is not None else np.flatnonzero(live))
            if fin is not None:
                self._store(fin, np.flatnonzero(ended))
            self._done |= ended
        return StepBatch(self._copy_obs(), reward, terminated, truncated, success, final_obs)

    def close(self) -> None:
        self.env.close()


class SingleFromBatched:
    """One env (gymnasium-style, :class:`~rlinf_cli.api.SingleEnv`) over a batched env of one.

    After an episode ends the engine has already begun the next one; call ``reset`` as usual.
    """

    def __init__(self, spec: EnvSpec, env: BatchedEnv):
        if int(env.num_envs) != 1:
            raise ValueError(f"SingleFromBatched needs a batch of one env, got {env.num_envs}")
        self.vec = BatchedVecEnv(spec, env, autoreset=True)

    def reset(self, *, seed: int | None = None) -> tuple[Obs, dict]:
        obs = self.vec.reset([seed])
        return {k: v[0] for k, v in obs.items()}, {}

    def step(self, action: np.ndarray) -> tuple[Obs, float, bool, bool, dict]:
        sb = self.vec.step(np.asarray(action)[None])
        obs = sb.final_obs if sb.final_obs is not None else sb.obs
        info: dict[str, Any] = {"success": bool(sb.success[0])} if self.vec.spec.has_success else {}
        return ({k: v[0] for k, v in obs.items()}, float(sb.reward[0]), bool(sb.terminated[0]),
                bool(sb.truncated[0]), info)

    def close(self) -> None:
        self.vec.close()


def shard_vec_env(simulator: Any, indices: Sequence[int], autoreset: bool) -> Any:
    """The VecEnv an env worker or a collocated executor builds for envs ``indices``: one batch
    of the simulator's own engine for a batched simulator, else single envs stepped in turn."""
    from rlinf_cli.api import BatchedSimulator
    from rlinf_cli.runtime.vector import SyncVecEnv

    if isinstance(simulator, BatchedSimulator):
        return BatchedVecEnv(simulator.spec, simulator.make_batched_env(list(indices)), autoreset, indices)
    return SyncVecEnv(simulator, indices, autoreset)
