"""model=vla through the CLI on Meta-World reach-v3 (state + instruction): collect -> sft -> rl
(PPO and GRPO, the algorithms unchanged) -> eval, checking what each stage leaves behind."""

from __future__ import annotations

import json

import numpy as np
import pytest

SIM = ["sim=metaworld", "sim.task=reach-v3", "sim.max_episode_steps=60"]
QUIET = ["progress=false", "tracking.enabled=false"]
VLA = ["model=vla", "model.backbone.hidden_size=64", "model.backbone.layers=2", "model.backbone.heads=2",
       "model.backbone.kv_heads=1", "model.backbone.intermediate_size=128"]


def test_vla_collect_sft_ppo_grpo_eval_chain(cli, workdir):
    res = cli("collect", *SIM, *QUIET, "policy=expert", "episodes=6", "num_envs=3", "output=data")
    assert res.code == 0, res.err
    meta = json.loads((workdir / "data" / "meta.json").read_text())
    assert meta["spec"]["observation"]["instruction"]["dtype"] == "str"  # the dataset keeps the instruction

    res = cli("sft", *QUIET, *VLA, "dataset=data", "algo.epochs=4", "algo.minibatch_size=64", "eval.episodes=2",
              "run_dir=runs/sft")
    assert res.code == 0, res.err
    sft = workdir / "runs" / "sft" / "checkpoints" / "best"
    cfg = json.loads((sft / "config.json").read_text())
    assert cfg["model"]["name"] == "vla" and (sft / "backbone" / "tokenizer.json").is_file()
    rows = [json.loads(line) for line in (workdir / "runs" / "sft" / "metrics.jsonl").read_text().splitlines()]
    losses = [r["train/loss"] for r in rows if "train/loss" in r]
    assert len(losses) >= 2 and losses[-1] < losses[0]  # cloning the expert's action tokens

    from rlinf_cli.policy import load_policy

    policy = load_policy(sft)
    assert "instruction" in policy.observation_keys and "task_id" not in policy.observation_keys

    # the shaped reward: a 4-epoch clone rarely succeeds in 128 steps, and all-zero sparse rewards
    # would give zero advantages (nothing to move the actor, whatever the code does)
    res = cli("rl", "--algo", "ppo", *QUIET, f"init={sft}", "num_envs=2", "algo.rollout_steps=32", "total_steps=128",
              "algo.critic_warmup_iters=1", "algo.minibatch_size=32", "sim.reward=shaped", "eval.episodes=2",
              "run_dir=runs/ppo")
    assert res.code == 0, res.err
    rows = [json.loads(line) for line in (workdir / "runs" / "ppo" / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in rows if "train/approx_kl" in r]
    assert any("train/value_loss" in r for r in rows) and train[-1]["train/approx_kl"] > 0  # the actor moved

    res = cli("rl", "--algo", "grpo", *QUIET, f"init={sft}", "algo.groups=1", "algo.group_size=2", "total_steps=120",
              "eval.episodes=2", "run_dir=runs/grpo")
    assert res.code == 0, res.err
    assert (workdir / "runs" / "grpo" / "checkpoints" / "final" / "model.safetensors").is_file()

    ppo = workdir / "runs" / "ppo" / "checkpoints" / "final"
    res = cli("eval", *QUIET, f"checkpoint={ppo}", "episodes=4", "num_envs=2", "run_dir=runs/eval")
    assert res.code == 0, res.err
    result = json.loads((workdir / "runs" / "eval" / "result.json").read_text())
    episodes = result["per_episode"]
    assert len(episodes) == 4
    assert result["eval"]["success_once"] == pytest.approx(np.mean([e["success_once"] for e in episodes]))


def test_vla_from_pixels_proprio_and_instruction(cli, workdir):
    """Demonstrations with state + image; the VLA reads the image, proprioception and instruction
    only, so it is trained with PPO and evaluated on a simulator that gives no state at all."""
    pix = ["sim=metaworld", "sim.task=reach-v3", "sim.max_episode_steps=30", "sim.image_size=48"]
    res = cli("collect", *pix, "sim.obs=state_rgb", *QUIET, "policy=expert", "episodes=2", "num_envs=2", "output=data")
    assert res.code == 0, res.err
    res = cli("sft", *QUIET, *VLA, "model.obs_keys=[rgb,proprio,instruction]", "dataset=data", "algo.epochs=2",
              "eval.episodes=0", "run_dir=runs/sft")
    assert res.code == 0, res.err
    sft = workdir / "runs" / "sft" / "checkpoints" / "best"
    res = cli("rl", "--algo", "ppo", *QUIET, *pix, "sim.obs=rgb", f"init={sft}", "num_envs=2", "algo.rollout_steps=16",
              "total_steps=64", "algo.critic_warmup_iters=1", "eval.episodes=0", "run_dir=runs/ppo")
    assert res.code == 0, res.err
    ppo = workdir / "runs" / "ppo" / "checkpoints" / "final"
    res = cli("eval", *QUIET, *pix, "sim.obs=rgb", f"checkpoint={ppo}", "episodes=2", "num_envs=2", "run_dir=runs/eval")
    assert res.code == 0, res.err
    from rlinf_cli.policy import load_policy

    policy = load_policy(ppo)
    assert policy.observation_keys == ("rgb", "proprio", "instruction") and "rgb" in policy.vision
    assert len(json.loads((workdir / "runs" / "eval" / "result.json").read_text())["per_episode"]) == 2


@pytest.mark.slow  # ~1 min each: DeepSpeed's start-up in a fresh process
@pytest.mark.parametrize("head", ["tokens", "chunk"])
def test_vla_trains_under_deepspeed_zero3(cli_proc, workdir, head):
    """ZeRO-3 partitions parameters and gathers them only inside module calls: the heads use
    their weights through module calls (or fall back to them), so both train and save."""
    from rlinf_cli.policy import load_policy

    res = cli_proc("rl", "--algo", "ppo", *SIM, "sim.reward=shaped", *QUIET, *VLA, f"model.head={head}", "num_envs=2",
                   "algo.rollout_steps=8", "total_steps=32", "eval.episodes=1", "train.backend=deepspeed",
                   "train.zero_stage=3", "run_dir=ds")
    assert res.code == 0, res.err[-2000:]
    rows = [json.loads(line) for line in (workdir / "ds" / "metrics.jsonl").read_text().splitlines()]
    assert any(r.get("train/grad_norm", 0) > 0 for r in rows)
    policy = load_policy(workdir / "ds" / "checkpoints" / "final")
    assert all(p.numel() > 0 for p in policy.parameters())

