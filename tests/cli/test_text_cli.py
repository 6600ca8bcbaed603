"""Text tasks through the CLI: collect -> sft -> rl (GRPO raises held-out reward) -> eval; DeepSpeed."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[2]
TINY = ["model=hf", "model.hidden_size=64", "model.layers=2", "model.heads=2", "model.kv_heads=1",
        "model.intermediate_size=128"]
QUIET = ["tracking.enabled=false", "progress=false"]


def metrics(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.slow
@pytest.mark.learning
def test_sft_then_grpo_raises_reward(cli, workdir, learning):
    r = cli("collect", "sim=arithmetic", "sim.digits=1", "policy=expert", "episodes=1000", "output=data/add.jsonl", *QUIET)
    assert r.code == 0, r.err
    assert (workdir / "data/add.jsonl.meta.json").is_file()
    r = cli("sft", "dataset=data/add.jsonl", *TINY, "algo.epochs=3", "algo.minibatch_size=32", "algo.lr=3e-3",
            "eval.episodes=40", "run_dir=sft", "seed=0", *QUIET)  # one clone: the RL seed varies
    assert r.code == 0, r.err
    sft = json.loads((workdir / "sft/result.json").read_text())
    assert sft["modality"] == "text" and 0.0 <= sft["eval"]["accuracy"] <= 1.0  # scored on the task from provenance
    # rl init= inherits the task (sim=arithmetic digits=1) and the model from the SFT checkpoint. Greedy reward is
    # measured on training-split prompts (eval.seed=0): what GRPO maximises. Held-out generalisation at scale is
    # benchmarks/sft_grpo_curve.py's job (a ~5M model, +20 points or more).
    r = cli("rl", "--algo", "grpo", f"init={sft['checkpoint']}", "text.iterations=30", "algo.groups=8",
            "algo.group_size=8", "algo.epochs=1", "algo.lr=2e-4", "eval.episodes=64", "eval.seed=0", "eval.interval=30",
            "run_dir=rl", f"seed={learning.seed}", *QUIET)
    assert r.code == 0, r.err
    rl = json.loads((workdir / "rl/result.json").read_text())
    before = next(m["eval/accuracy"] for m in metrics(workdir / "rl") if m["step"] == 0)
    # one clone (SFT at seed 0, 19% greedy), the RL seed varied: +0.14 to +0.39 over seeds 0-4 and
    # the lesser-CPU settings (docs/benchmarks.md, "Learning-test margins")
    learning.record(rl["eval"]["accuracy"] - before, 0.05, before=before)
    assert rl["eval"]["accuracy"] >= before + 0.05, (before, rl["eval"])  # GRPO raised the reward
    # eval reads the task from the checkpoint; pass@k with sampling, and a table of examples
    r = cli("eval", f"checkpoint={rl['checkpoint']}", "episodes=64", "seed=0", "text.pass_k=4", *QUIET)
    assert r.code == 0, r.err
    out = r.json_tail()
    assert out["accuracy"] == rl["eval"]["accuracy"]  # greedy on the same prompts from the saved checkpoint
    assert 0.0 <= out["sampled_accuracy"] <= out["pass@4"] <= 1.0 and "examples (greedy)" in r.out


@pytest.mark.slow
@pytest.mark.learning
def test_sft_then_ppo_raises_reward(cli, workdir, learning):
    """PPO with a value head on the language model, from the same kind of clone as the GRPO test:
    greedy reward on training-split prompts rises. A steps rollout of 8 x 8 one-completion episodes
    per iteration; gamma 1 (a token is no unit of time); three critic-only iterations first."""
    r = cli("collect", "sim=arithmetic", "sim.digits=1", "policy=expert", "episodes=1000", "output=data/add.jsonl", *QUIET)
    assert r.code == 0, r.err
    r = cli("sft", "dataset=data/add.jsonl", *TINY, "algo.epochs=3", "algo.minibatch_size=32", "algo.lr=3e-3",
            "eval.episodes=0", "run_dir=sft", "seed=0", *QUIET)  # one clone: the RL seed varies
    assert r.code == 0, r.err
    r = cli("rl", "--algo", "ppo", "init=sft/checkpoints/best", "text.iterations=30", "algo.rollout_steps=8",
            "num_envs=8", "algo.minibatch_size=16", "algo.epochs=2", "algo.lr=2e-4", "algo.gamma=1.0",
            "algo.gae_lambda=0.95", "algo.critic_warmup_iters=3", "algo.critic_warmup_lr=1e-3", "eval.episodes=64",
            "eval.seed=0", "eval.interval=30", "run_dir=rl", f"seed={learning.seed}", *QUIET)
    assert r.code == 0, r.err
    rows = metrics(workdir / "rl")
    before = next(m["eval/accuracy"] for m in rows if m["step"] == 0)
    after = json.loads((workdir / "rl/result.json").read_text())["eval"]["accuracy"]
    # one clone (SFT at seed 0, 19% greedy), the RL seed varied: +0.28 to +0.41 over seeds 0-5, +0.23 to +0.30
    # under the lesser-CPU settings (docs/llm.md, "PPO on text"; docs/benchmarks.md, "Learning-test margins")
    learning.record(after - before, 0.10, before=before)
    assert after >= before + 0.10, (before, after)  # PPO raised the reward
    assert all(m["train/value_loss"] > 0 for m in rows if "train/value_loss" in m)  # the critic trained throughout


def test_text_user_errors(cli, workdir):
    (workdir / "bad.jsonl").write_text('{"prompt": "1+1="}\n')
    r = cli("sft", "dataset=bad.jsonl", "model=hf", *QUIET)
    assert r.code == 2 and "needs string fields 'prompt' and 'completion'" in r.err
    # model=hf adds a value head for PPO by itself (test below); a model that cannot is refused in one line
    r = cli("rl", "--algo", "ppo", "sim=gymnasium", "model=mlp", "model.critic=false", *QUIET)
    assert r.code == 2 and "needs a critic but the model has none (set model.critic=true)" in r.err
    r = cli("rl", "--algo", "grpo", "sim=arithmetic", "model=mlp", *QUIET)
    assert r.code == 2 and "not a text model" in r.err
    r = cli("collect", "sim=arithmetic", "policy=expert", "output=data/x", *QUIET)
    assert r.code == 2 and "JSONL" in r.err


def test_rl_text_tiny_run_with_variants_and_dynamic_sampling(cli, workdir):
    for algo in ("rloo", "reinforce++"):
        r = cli("rl", "--algo", algo, "sim=arithmetic", "sim.digits=1", *TINY, "text.iterations=2", "algo.groups=2",
                "algo.group_size=4", "algo.filter_groups=true", "algo.refill_rounds=1", "eval.episodes=4",
                f"run_dir={algo}", *QUIET)
        assert r.code == 0, r.err
        rows = metrics(workdir / algo)
        it = [m for m in rows if "rollout/groups_kept" in m]
        assert len(it) == 2 and all(m["rollout/groups_kept"] <= 2 for m in it)


def test_ppo_on_text_trains_a_value_head_saves_and_resumes_exactly(cli, workdir):
    """PPO on a text task through the one update: the model gets a value head by itself, the head
    trains (from zero) with the policy and lives in the checkpoint; a run resumed from the first
    iteration's checkpoint ends with the same weights, head included."""
    from safetensors.torch import load_file

    # a reward for any number in the answer: an untrained model's completions differ in reward
    ppo = ["--algo", "ppo", "sim=arithmetic", "sim.digits=1", "sim.format_reward=0.5", *TINY, "text.iterations=2",
           "algo.rollout_steps=2", "num_envs=4", "algo.minibatch_size=4", "algo.epochs=2", "algo.lr=1e-3",
           "algo.gamma=1.0", "checkpoint.interval=1", "eval.episodes=2", *QUIET]
    r = cli("rl", *ppo, "run_dir=ppo")
    assert r.code == 0, r.err
    assert "the model had no critic: ppo trains a fresh value head" in r.out + r.err
    rows = [m for m in metrics(workdir / "ppo") if "train/value_loss" in m]
    assert len(rows) == 2 and all(m["train/value_loss"] > 0 and m["train/samples"] == 8 for m in rows)
    final = workdir / "ppo/checkpoints/final"
    assert json.loads((final / "config.json").read_text())["model"]["critic"] is True
    head = load_file(str(final / "value_head.safetensors"))
    assert head["linear.weight"].abs().sum() > 0  # trained from its zero start
    r = cli("rl", f"resume={workdir / 'ppo/checkpoints/iter_000001'}", "run_dir=resumed", *QUIET)
    assert r.code == 0, r.err
    resumed = workdir / "resumed/checkpoints/final"
    for name in ("value_head.safetensors", "hf/model.safetensors"):
        a, b = load_file(str(final / name)), load_file(str(resumed / name))
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a), name


def _torchrun() -> str:
    return str(Path(sys.executable).with_name("torchrun"))


@pytest.mark.slow
@pytest.mark.parametrize("backend, stage", [("deepspeed", 2), ("deepspeed", 3), ("torch", 0)])
def test_two_process_engine_step(backend, stage):
    proc = subprocess.run([_torchrun(), "--standalone", "--nproc_per_node", "2", str(REPO / "tests/scripts/engine_step.py"),
                           backend, str(stage)], capture_output=True, text=True, timeout=900,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["backend"] == backend and out["world"] == 2
    assert out["ranks_agree"] and out["moved"] > 0  # gradients were averaged, weights changed identically
    assert out["losses"][-1] < out["losses"][0]


@pytest.mark.slow
def test_rl_cli_under_torchrun_with_deepspeed(workdir):
    rlinf_main = [_torchrun(), "--standalone", "--nproc_per_node", "2", "-m", "rlinf_cli"]
    proc = subprocess.run([*rlinf_main, "rl", "--algo", "grpo", "sim=arithmetic", "sim.digits=1", *TINY,
                           "text.iterations=2", "algo.groups=2", "algo.group_size=4", "eval.episodes=4",
                           "train.backend=deepspeed", "train.zero_stage=2", "run_dir=ds", *QUIET],
                          capture_output=True, text=True, timeout=900, cwd=workdir, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads((workdir / "ds/result.json").read_text())
    assert result["backend"] == "deepspeed" and result["world_size"] == 2 and result["iterations"] == 2
    assert (workdir / "ds/checkpoints/final/hf/config.json").is_file()
    shutil.rmtree(workdir / "ds")


def test_rl_with_tools_logs_tool_metrics(cli, workdir):
    """A short GRPO run on the word problems with the python tool: it completes, and the tool metrics
    reach metrics.jsonl and MLflow like the others; the tools-disabled control evaluates the same
    checkpoint on the same prompts without tool turns."""
    from mlflow.tracking import MlflowClient

    r = cli("rl", "--algo", "grpo", "sim=word_problems", "sim.tools=[python]", "+sim.tool_options.python.wall_s=5",
            *TINY, "text.iterations=2", "algo.groups=2", "algo.group_size=2", "eval.episodes=2", "run_dir=tools",
            "progress=false")
    assert r.code == 0, r.err
    rows = [m for m in metrics(workdir / "tools") if "rollout/reward_mean" in m]
    assert len(rows) == 2
    for m in rows:
        assert m["rollout/turns_mean"] >= 1.0 and m["rollout/tool_calls_mean"] >= 0.0 and m["rollout/tool_errors"] >= 0
        assert ("rollout/tool_call_success" in m) == (m["rollout/tool_calls_mean"] > 0)
    result = json.loads((workdir / "tools/result.json").read_text())
    client = MlflowClient(tracking_uri=f"sqlite:///{workdir / 'rlinf_runs' / 'mlflow.db'}")
    logged = client.get_run(result["mlflow_run_id"]).data
    assert {"rollout/turns_mean", "rollout/tool_calls_mean", "rollout/tool_errors", "eval/turns_mean"} <= set(logged.metrics)
    assert logged.params["sim.tools"] == "['python']" and logged.params["sim.tool_options.python.wall_s"] == "5"

    r = cli("eval", f"checkpoint={result['checkpoint']}", "sim.tools=[]", "episodes=2", *QUIET)
    assert r.code == 0, r.err
    out = r.json_tail()
    assert out["turns_mean"] == 1.0 and "tool_calls_mean" not in out  # the control: no tool turns
