"""model=mlp model.head=flow through the CLI on Meta-World reach-v3: sft clones with the
flow-matching loss, PPO (steps) and GRPO (episodes) train on the recorded denoising chains, in
process and in env worker processes, and eval runs the deterministic ODE."""

from __future__ import annotations

import json
import math

import pytest

QUIET = ["progress=false", "tracking.enabled=false"]
SIM = ["sim=metaworld", "sim.task=reach-v3", "sim.max_episode_steps=40"]
FLOW = ["model=mlp", "model.head=flow", "model.chunk=4", "model.flow_steps=3"]


@pytest.mark.parametrize("noise", ["noise", "sde"])
def test_flow_policy_through_sft_ppo_grpo_and_eval(cli, workdir, noise):
    res = cli("collect", *SIM, *QUIET, "policy=expert", "episodes=2", "num_envs=2", "output=data")
    assert res.code == 0, res.err
    res = cli("sft", *QUIET, *FLOW, f"model.flow_noise={noise}", "dataset=data", "algo.epochs=3",
              "eval.episodes=0", "run_dir=runs/sft")
    assert res.code == 0, res.err
    rows = [json.loads(line) for line in (workdir / "runs/sft/metrics.jsonl").read_text().splitlines()]
    assert all(r["train/loss"] > 0 for r in rows if "train/loss" in r)  # the flow-matching loss, not an nll
    sft = workdir / "runs" / "sft" / "checkpoints" / "best"
    res = cli("rl", "--algo", "ppo", *QUIET, f"init={sft}", "num_envs=2", "algo.rollout_steps=8", "total_steps=32",
              "algo.critic_warmup_iters=0", "eval.episodes=0", "run_dir=runs/ppo")
    assert res.code == 0, res.err
    ppo = [json.loads(line) for line in (workdir / "runs/ppo/metrics.jsonl").read_text().splitlines()]
    kl = [r["train/approx_kl"] for r in ppo if "train/approx_kl" in r]
    assert kl and all(math.isfinite(v) for v in kl)  # (act = evaluate exactly: tests/models/test_flow_head.py)
    res = cli("rl", "--algo", "grpo", *QUIET, f"init={sft}", "algo.groups=1", "algo.group_size=2", "total_steps=20",
              "eval.episodes=0", "run_dir=runs/grpo")
    assert res.code == 0, res.err
    res = cli("rl", "--algo", "ppo", *QUIET, f"init={sft}", "num_envs=2", "algo.rollout_steps=8", "total_steps=32",
              "algo.critic_warmup_iters=0", "eval.episodes=0", "runtime.mode=disaggregated",
              "run_dir=runs/ppo_workers")
    assert res.code == 0, res.err
    res = cli("eval", *QUIET, f"checkpoint={workdir / 'runs/ppo/checkpoints/final'}", "episodes=2", "num_envs=2",
              "run_dir=runs/eval")
    assert res.code == 0, res.err
    episodes = json.loads((workdir / "runs" / "eval" / "result.json").read_text())["per_episode"]
    assert all(1 <= e["length"] <= 10 for e in episodes)  # policy steps: 40 env steps in chunks of 4


def test_flow_head_refuses_mse_cloning_in_one_line(cli, workdir):
    res = cli("collect", *SIM, *QUIET, "policy=expert", "episodes=1", "num_envs=1", "output=data")
    assert res.code == 0, res.err
    res = cli("sft", *QUIET, *FLOW, "algo.loss=mse", "dataset=data", "algo.epochs=1", "eval.episodes=0")
    assert res.code == 2 and "algo.loss=nll" in res.err, res.err


def test_vla_flow_head_through_sft_ppo_and_grpo(cli, workdir):
    from tests.cli.test_vla_cli import VLA

    res = cli("collect", *SIM, *QUIET, "policy=expert", "episodes=2", "num_envs=2", "output=data")
    assert res.code == 0, res.err
    res = cli("sft", *QUIET, *VLA, "model.head=flow", "model.chunk=4", "model.flow_steps=2", "dataset=data",
              "algo.epochs=2", "eval.episodes=0", "run_dir=runs/sft")
    assert res.code == 0, res.err
    sft = workdir / "runs" / "sft" / "checkpoints" / "best"
    res = cli("rl", "--algo", "ppo", *QUIET, f"init={sft}", "num_envs=2", "algo.rollout_steps=8", "total_steps=32",
              "algo.critic_warmup_iters=0", "eval.episodes=2", "run_dir=runs/ppo")
    assert res.code == 0, res.err
    res = cli("rl", "--algo", "grpo", *QUIET, f"init={sft}", "algo.groups=1", "algo.group_size=2", "total_steps=20",
              "eval.episodes=0", "run_dir=runs/grpo")
    assert res.code == 0, res.err


def test_mlp_flow_through_the_env_server_with_overlapped_rollouts(cli, workdir):
    """The chain travels with the experience wherever the policy acts: in this process next to an
    env server (`sim=remote`), and in the overlapped rollout process (`runtime.overlap_update`)."""
    from rlinf_sim_gymnasium.sim import GymnasiumSimulator
    from tests.cli.test_remote import serving

    common = ["--algo", "ppo", *QUIET, "model=mlp", "model.head=flow", "model.flow_steps=2", "algo.rollout_steps=16",
              "num_envs=2", "eval.episodes=1", "total_steps=64"]
    with serving(GymnasiumSimulator({"env_id": "Pendulum-v1"}), max_sessions=4) as address:  # training 2 sessions, validation 2 more
        remote = ["sim=remote", f"sim.address={address}"]
        res = cli("rl", *remote, *common, "run_dir=remote")
        assert res.code == 0, res.err
        res = cli("rl", *remote, *common, "runtime.overlap_update=true", "run_dir=over")
        assert res.code == 0, res.err
    for run in ("remote", "over"):
        rows = [json.loads(line) for line in (workdir / run / "metrics.jsonl").read_text().splitlines()]
        kl = [r["train/approx_kl"] for r in rows if "train/approx_kl" in r]
        assert len(kl) == 2 and all(math.isfinite(v) for v in kl), (run, kl)
