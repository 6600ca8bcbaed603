"""Action chunks (rlinf_cli/runtime/chunking.py and model=vla model.head=chunk): one policy step
executes K env actions; rewards are summed, an episode's end stops the chunk, datasets give K
future actions, and the chunk head's log-probs match between acting and training."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from rlinf_cli.api import ArraySpec, EnvSpec
from rlinf_cli.runtime.chunking import ChunkedSimulator, chunk_targets

pytestmark = pytest.mark.numerics  # results depend on CPU features: make test-portable runs them again


class _CountingEnv:
    """Reward = the action's first entry + 1 at every step; terminates after 5 steps; success at step 5."""

    def __init__(self):
        self.t, self.actions = 0, []

    def reset(self, *, seed=None):
        self.t = 0
        return {"state": np.array([0.0], np.float32)}, {}

    def step(self, a):
        self.t += 1
        self.actions.append(float(a[0]))
        obs = {"state": np.array([self.t], np.float32)}
        return obs, float(a[0]) + 1.0, self.t >= 5, False, {"success": self.t >= 5}

    def close(self):
        pass


class _CountingSim:
    spec = EnvSpec({"state": ArraySpec((1,), "float32")}, ArraySpec((2,), "float32", -1.0, 1.0),
                   max_episode_steps=9, has_success=True)

    def __init__(self):
        self.envs = []

    def make_env(self, index):
        self.envs.append(_CountingEnv())
        return self.envs[-1]

    def expert(self):
        return None


def test_a_chunk_sums_rewards_and_stops_at_the_episode_end():
    from rlinf_cli.runtime.vector import SyncVecEnv

    sim = ChunkedSimulator(_CountingSim(), 2)
    assert sim.spec.action.shape == (2, 2) and sim.spec.max_episode_steps == 5  # ceil(9 / 2) policy steps
    env = SyncVecEnv(sim, [0], autoreset=True)
    env.reset([0])
    chunk = np.array([[[0.0, 0.0], [1.0, 0.0]]], np.float32)  # rewards 1 and 2 per chunk
    rewards, ends = [], []
    for _ in range(4):
        sb = env.step(chunk)
        rewards.append(float(sb.reward[0]))
        ends.append(bool(sb.terminated[0]))
        assert bool(sb.success[0]) == ends[-1]
    # steps 1-2, 3-4, then step 5 ends the episode: the chunk's second action is not executed
    assert rewards == [3.0, 3.0, 1.0, 3.0] and ends == [False, False, True, False]
    inner = sim.inner.envs[0]
    assert inner.actions == [0.0, 1.0, 0.0, 1.0, 0.0, 0.0, 1.0]  # 5 steps, then the new episode's chunk


def test_chunk_targets_stay_in_their_episode():
    actions = np.arange(5, dtype=np.float32)[:, None]
    episode = np.array([0, 0, 0, 1, 1])
    out = chunk_targets(actions, episode, 3)[..., 0]
    assert out.tolist() == [[0, 1, 2], [1, 2, 2], [2, 2, 2], [3, 4, 4], [4, 4, 4]]


def _chunk_policy():
    from tests.models.test_vla_model import _node, _obs, _spec
    from rlinf_model_vla.model import VLAPolicy

    torch.manual_seed(0)
    return VLAPolicy(_node(head="chunk", chunk=3), _spec()), _obs(5)


def test_chunk_head_logprobs_match_and_round_trip(tmp_path):
    from rlinf_cli.policy import load_policy

    policy, obs = _chunk_policy()
    assert policy.action_chunk == 3
    with torch.no_grad():
        out = policy.act(obs)
        ev = policy.evaluate(obs, out.action)
        det = policy.act(obs, deterministic=True)
    assert out.action.shape == (5, 3, 3) and out.logprob.shape == (5,)
    torch.testing.assert_close(ev.logprob, out.logprob, rtol=0, atol=1e-5)
    torch.testing.assert_close(ev.value, out.value, rtol=0, atol=1e-5)
    torch.testing.assert_close(det.action, policy.mean_action(obs).detach())
    assert policy.set_action_std(0.3, trainable=False) and not policy.chunk_head.log_std.requires_grad
    policy.save_pretrained(tmp_path / "ckpt")
    loaded = load_policy(tmp_path / "ckpt")
    with torch.no_grad():
        torch.testing.assert_close(loaded.evaluate(obs, out.action).logprob, policy.evaluate(obs, out.action).logprob,
                                   rtol=0, atol=0)


QUIET = ["progress=false", "tracking.enabled=false"]
SIM = ["sim=metaworld", "sim.task=reach-v3", "sim.max_episode_steps=40"]


def test_chunk_policy_through_the_cli(cli, workdir):
    from tests.cli.test_vla_cli import VLA

    res = cli("collect", *SIM, *QUIET, "policy=expert", "episodes=2", "num_envs=2", "output=data")
    assert res.code == 0, res.err
    res = cli("sft", *QUIET, *VLA, "model.head=chunk", "model.chunk=4", "dataset=data", "algo.epochs=3",
              "eval.episodes=0", "run_dir=runs/sft")
    assert res.code == 0, res.err
    sft = workdir / "runs" / "sft" / "checkpoints" / "best"
    res = cli("rl", "--algo", "ppo", *QUIET, f"init={sft}", "num_envs=2", "algo.rollout_steps=8", "total_steps=32",
              "algo.critic_warmup_iters=0", "eval.episodes=0", "run_dir=runs/ppo")
    assert res.code == 0, res.err
    res = cli("rl", "--algo", "grpo", *QUIET, f"init={sft}", "algo.groups=1", "algo.group_size=2", "total_steps=20",
              "eval.episodes=0", "run_dir=runs/grpo")
    assert res.code == 0, res.err
    res = cli("eval", *QUIET, f"checkpoint={workdir / 'runs/ppo/checkpoints/final'}", "episodes=2", "num_envs=2",
              "run_dir=runs/eval")
    assert res.code == 0, res.err
    episodes = json.loads((workdir / "runs" / "eval" / "result.json").read_text())["per_episode"]
    assert all(1 <= e["length"] <= 10 for e in episodes)  # policy steps: 40 env steps in chunks of 4
    # demonstrations are one action per step: a chunk policy cannot record them
    res = cli("collect", *SIM, *QUIET, f"policy={sft}", "episodes=1", "num_envs=1", "output=data2")
    assert res.code == 2 and "acts in chunks of 4" in res.err


def test_chunk_policy_in_worker_processes_resumes_exactly(cli, workdir):
    """The chunked simulator travels to env worker processes, and a run resumed from its first
    checkpoint replays the [K, d] actions of the running episodes and ends bit for bit equal."""
    from safetensors.torch import load_file

    from tests.cli.test_vla_cli import VLA

    res = cli("collect", *SIM, *QUIET, "policy=expert", "episodes=2", "num_envs=2", "output=data")
    assert res.code == 0, res.err
    res = cli("sft", *QUIET, *VLA, "model.head=chunk", "model.chunk=4", "dataset=data", "algo.epochs=1",
              "eval.episodes=0", "run_dir=runs/sft")
    assert res.code == 0, res.err
    args = [*QUIET, f"init={workdir / 'runs/sft/checkpoints/best'}", "num_envs=2", "algo.rollout_steps=8",
            "total_steps=48", "algo.critic_warmup_iters=0", "eval.episodes=0", "runtime.mode=disaggregated",
            "checkpoint.interval=1", "checkpoint.keep=10", "seed=3"]
    res = cli("rl", "--algo", "ppo", *args, "run_dir=a")
    assert res.code == 0, res.err
    assert "worker process" in res.out + res.err
    res = cli("rl", *QUIET, f"resume={workdir / 'a/checkpoints/iter_000001'}", "run_dir=c")
    assert res.code == 0, res.err
    full = load_file(str(workdir / "a/checkpoints/final/model.safetensors"))
    resumed = load_file(str(workdir / "c/checkpoints/final/model.safetensors"))
    for k in full:
        torch.testing.assert_close(full[k], resumed[k], rtol=0, atol=0)
