"""A fake Isaac Lab env with the real API shape, for rlinf-sim-isaaclab's unit tests.

What it reproduces of Isaac Lab 3's ``DirectRLEnv`` (checked against the real env by
tests/sims/test_isaaclab.py::test_fake_matches_the_real_env, marker ``isaaclab``):

- ``reset(seed=s) -> (obs, extras)``; the seed goes to torch's *global* generator (Isaac Lab seeds
  torch, numpy, Python and warp from one number); the whole batch is reset;
- ``step(actions[N, A]) -> (obs, reward, terminated, time_outs, extras)``: batched torch tensors
  (float32 ``[N]`` reward, bool ``[N]`` flags) on ``device``; envs that finished are reset inside
  the step and their rows of ``obs`` begin the next episode;
- ``obs`` is ``{"policy": float32 [N, D]}`` (plus ``"critic"`` when ``state_dim`` > 0); ``extras``
  holds ``"log"`` and, with ``cfg.compute_final_obs``, ``"final_obs"`` (the observations before
  the reset, same groups);
- ``time_outs`` at ``max_episode_length`` steps; ``unwrapped``, ``num_envs``, ``device``,
  ``single_observation_space`` (a Dict of Boxes) and ``single_action_space``.

The dynamics are a cart-pole in the spirit of Isaac Lab's: the pole falls unless pushed back, an
episode terminates when it leans past ``max_angle``, a reward of 1 per step alive and -2 on a fall.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np
import torch

from rlinf_cli.api import ArraySpec, EnvSpec


@dataclass
class FakeCfg:
    compute_final_obs: bool = False


class FakeIsaacLabEnv:
    def __init__(self, num_envs: int, device: str = "cpu", obs_dim: int = 4, act_dim: int = 1, state_dim: int = 0,
                 max_episode_length: int = 50, max_angle: float = 0.4, compute_final_obs: bool = False):
        import gymnasium as gym

        self.num_envs, self.device = num_envs, torch.device(device)
        self.obs_dim, self.act_dim, self.state_dim = obs_dim, act_dim, state_dim
        self.max_episode_length, self.max_angle = max_episode_length, max_angle
        self.cfg = FakeCfg(compute_final_obs)
        groups = {"policy": gym.spaces.Box(-np.inf, np.inf, (obs_dim,), np.float32)}
        if state_dim:
            groups["critic"] = gym.spaces.Box(-np.inf, np.inf, (state_dim,), np.float32)
        self.single_observation_space = gym.spaces.Dict(groups)
        self.single_action_space = gym.spaces.Box(-np.inf, np.inf, (act_dim,), np.float32)
        self.state = torch.zeros((num_envs, 4), device=self.device)  # cart x, pole angle, their velocities
        self.episode_length_buf = torch.zeros(num_envs, dtype=torch.long, device=self.device)
        self.extras: dict[str, Any] = {"log": {}}
        self.closed = False
        self.steps = 0

    @property
    def unwrapped(self) -> "FakeIsaacLabEnv":
        return self

    def _reset_idx(self, ids: torch.Tensor) -> None:
        self.state[ids] = (torch.rand((len(ids), 4)) * 0.2 - 0.1).to(self.device)
        self.episode_length_buf[ids] = 0

    def _obs(self) -> dict[str, torch.Tensor]:
        pol = torch.zeros((self.num_envs, self.obs_dim), device=self.device)
        pol[:, :min(4, self.obs_dim)] = self.state[:, :min(4, self.obs_dim)]
        out = {"policy": pol}
        if self.state_dim:
            out["critic"] = torch.cat([self.state, self.episode_length_buf[:, None].float()], 1)[:, :self.state_dim]
        return out

    def reset(self, seed: int | None = None, options: Any = None) -> tuple[dict[str, torch.Tensor], dict]:
        if seed is not None:
            torch.manual_seed(seed)
        self._reset_idx(torch.arange(self.num_envs, device=self.device))
        return self._obs(), self.extras

    def step(self, action: torch.Tensor) -> tuple[dict, torch.Tensor, torch.Tensor, torch.Tensor, dict]:
        assert action.shape == (self.num_envs, self.act_dim), action.shape
        self.steps += 1
        force = action.to(self.device)[:, 0]
        x, th, v, w = self.state.unbind(1)
        w = w + 0.05 * (3.0 * torch.sin(th) - force)
        v = v + 0.05 * force
        self.state = torch.stack([x + 0.05 * v, th + 0.05 * w, v, w], 1)
        self.episode_length_buf += 1
        terminated = self.state[:, 1].abs() > self.max_angle
        time_outs = self.episode_length_buf >= self.max_episode_length
        reward = torch.where(terminated, torch.tensor(-2.0), torch.tensor(1.0)).float()
        self.extras = {"log": {}}
        done = (terminated | time_outs).nonzero().flatten()
        if len(done):
            if self.cfg.compute_final_obs:
                self.extras["final_obs"] = self._obs()
            self._reset_idx(done)
        return self._obs(), reward, terminated, time_outs, self.extras

    def close(self) -> None:
        self.closed = True


class FakeIsaacLabSimulator:
    """A :class:`~rlinf_cli.api.BatchedSimulator` over :class:`FakeIsaacLabEnv` through the plugin's
    own adapter (``rlinf_sim_isaaclab.batch.IsaacLabBatch``), as ``IsaacLabSimulator`` builds it."""

    def __init__(self, horizon: int = 50, state_dim: int = 0, success: str = "time_out", final_obs: bool = True):
        self.horizon, self.state_dim, self.success, self.final_obs = horizon, state_dim, success, final_obs
        obs = {"state": ArraySpec((4,), "float32")}
        if state_dim:
            obs["critic"] = ArraySpec((state_dim,), "float32")
        self.spec = EnvSpec(obs, ArraySpec((1,), "float32", -1.0, 1.0), max_episode_steps=horizon,
                            has_success=success != "none", replayable=False, per_env_seeds=False)
        self.built: list[int] = []

    def make_batched_env(self, indices: Sequence[int]) -> Any:
        from rlinf_sim_isaaclab.batch import IsaacLabBatch

        torch.set_num_threads(1)
        self.built.append(len(indices))
        env = FakeIsaacLabEnv(len(indices), state_dim=self.state_dim, max_episode_length=self.horizon,
                              compute_final_obs=self.final_obs)
        return IsaacLabBatch(env, "policy", self.success, 1.0)

    def make_env(self, index: int) -> Any:
        from rlinf_cli.runtime.batched import SingleFromBatched

        return SingleFromBatched(self.spec, self.make_batched_env([index]))

    def expert(self) -> None:
        return None
