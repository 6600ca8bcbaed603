"""collect -> sft -> rl -> eval on Meta-World through the CLI, checking what each stage leaves behind."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest


SIM = ["sim=metaworld", "sim.task=reach-v3", "sim.max_episode_steps=60"]
QUIET = ["progress=false"]


def mlflow_run(workdir: Path, run_id: str):
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{workdir / 'rlinf_runs' / 'mlflow.db'}")
    return client.get_run(run_id)


def test_expert_collect_sft_rl_eval_chain(cli, workdir):
    # collect: the scripted expert solves reach-v3 (>= 90%), every episode lands in the dataset
    res = cli("collect", *SIM, *QUIET, "policy=expert", "episodes=10", "num_envs=5", "output=data", "run_dir=runs/collect")
    assert res.code == 0, res.err
    meta = json.loads((workdir / "data" / "meta.json").read_text())
    assert meta["episodes"] == 10 and meta["successes"] >= 9 and meta["spec"]["has_success"]
    assert meta["provenance"][0]["sim"]["task"] == "reach-v3"
    assert all((workdir / "data" / c["file"]).is_file() for c in meta["chunks"])

    # sft: a checkpoint that remembers the dataset's simulator
    res = cli("sft", *QUIET, "dataset=data", "algo.epochs=5", "eval.episodes=0", "run_dir=runs/sft")
    assert res.code == 0, res.err
    sft_ckpt = workdir / "runs" / "sft" / "checkpoints" / "best"
    assert (sft_ckpt / "model.safetensors").is_file() and (sft_ckpt / "config.json").is_file()
    assert "metaworld" in (sft_ckpt / "rlinf.yaml").read_text()

    # rl from the SFT checkpoint: the simulator is inherited, the action std reset for exploration
    res = cli("rl", "--algo", "ppo", *QUIET, f"init={sft_ckpt}", "num_envs=2", "algo.rollout_steps=32",
              "total_steps=128", "algo.critic_warmup_iters=1", "eval.episodes=2", "run_dir=runs/rl")
    assert res.code == 0, res.err
    rl_ckpt = workdir / "runs" / "rl" / "checkpoints" / "final"
    assert (rl_ckpt / "model.safetensors").is_file()
    from rlinf_cli.policy import load_policy

    policy = load_policy(rl_ckpt)  # std reset for exploration and kept fixed while the mean learns
    assert np.allclose(policy.log_std.exp().detach().numpy(), 0.3, atol=1e-6)
    rows = [json.loads(line) for line in (workdir / "runs" / "rl" / "metrics.jsonl").read_text().splitlines()]
    assert any("train/value_loss" in r for r in rows)

    # eval: success is a rate in [0, 1] that matches the episodes it reports, in JSON and MLflow
    res = cli("eval", *QUIET, f"checkpoint={rl_ckpt}", "episodes=6", "num_envs=3", "run_dir=runs/eval")
    assert res.code == 0, res.err
    result = json.loads((workdir / "runs" / "eval" / "result.json").read_text())
    episodes = result["per_episode"]
    assert len(episodes) == 6 and [e["seed"] for e in episodes] == list(range(1_000_000, 1_000_006))
    for key in ("success_once", "success_at_end"):
        assert 0.0 <= result["eval"][key] <= 1.0
        assert result["eval"][key] == pytest.approx(np.mean([e[key] for e in episodes]))
    assert result["eval"]["length_mean"] == pytest.approx(np.mean([e["length"] for e in episodes]))
    assert all(1 <= e["length"] <= 60 and e["task"] == 0 for e in episodes)
    assert res.json_tail()["success_once"] == result["eval"]["success_once"]
    run = mlflow_run(workdir, result["mlflow_run_id"])
    assert run.info.status == "FINISHED"
    assert run.data.metrics["eval/success_once"] == pytest.approx(result["eval"]["success_once"])
    assert run.data.tags["plugin.sim"].startswith("metaworld")


def test_multi_task_eval_reports_each_task(cli, workdir):
    tasks = "sim.tasks=[reach-v3,drawer-close-v3]"
    res = cli("eval", "sim=metaworld", tasks, "sim.max_episode_steps=150", *QUIET, "checkpoint=expert",
              "episodes=4", "num_envs=4", "run_dir=runs/eval")
    assert res.code == 0, res.err
    result = json.loads((workdir / "runs" / "eval" / "result.json").read_text())
    assert set(result["per_task"]) == {"reach-v3", "drawer-close-v3"}
    for name, summary in result["per_task"].items():
        mine = [e for e in result["per_episode"] if e["task"] == ["reach-v3", "drawer-close-v3"].index(name)]
        assert summary["episodes"] == len(mine) == 2
        assert summary["success_once"] == pytest.approx(np.mean([e["success_once"] for e in mine]))
    assert result["task_mean"]["success_once"] == pytest.approx(
        np.mean([s["success_once"] for s in result["per_task"].values()]))
    assert "drawer-close-v3" in res.out and "mean over 2 tasks" in res.out
    metrics = mlflow_run(workdir, result["mlflow_run_id"]).data.metrics
    assert metrics["eval/task/reach-v3/success_once"] == result["per_task"]["reach-v3"]["success_once"]


def test_multi_task_sft_embeds_the_task(cli, workdir):
    tasks = "sim.tasks=[reach-v3,button-press-v3]"
    res = cli("collect", "sim=metaworld", tasks, "sim.max_episode_steps=100", *QUIET, "policy=expert",
              "episodes=4", "num_envs=4", "output=data")
    assert res.code == 0, res.err
    res = cli("sft", *QUIET, "dataset=data", "algo.epochs=2", "eval.episodes=0", "run_dir=runs/sft")
    assert res.code == 0, res.err
    from rlinf_cli.policy import load_policy

    policy = load_policy(workdir / "runs" / "sft" / "checkpoints" / "best")
    assert policy.task_embed.num_embeddings == 2 and policy.env_spec.tasks == ("reach-v3", "button-press-v3")
    # a multi-task policy refuses another task list: its task ids would name other tasks
    res = cli("eval", f"checkpoint={workdir / 'runs' / 'sft' / 'checkpoints' / 'best'}", "sim.tasks=[push-v3,reach-v3]",
              *QUIET, "episodes=1")
    assert res.code == 2 and "task ids would name other tasks" in (res.err + res.out)


def test_collect_with_action_noise(cli, workdir):
    """Noisy expert demos: same seeds, other actions, still mostly successful."""
    from rlinf_cli.data import dataset as ds

    args = [*SIM, *QUIET, "sim.max_episode_steps=100", "policy=expert", "episodes=4", "num_envs=4"]
    assert cli("collect", *args, "output=clean").code == 0
    res = cli("collect", *args, "action_noise=0.3", "output=noisy")
    assert res.code == 0, res.err
    clean, noisy = ds.load(workdir / "clean"), ds.load(workdir / "noisy")
    assert noisy.meta["provenance"][0]["action_noise"] == 0.3
    np.testing.assert_array_equal(clean.obs["state"][0], noisy.obs["state"][0])  # same seed, same start
    n = min(len(clean.actions), len(noisy.actions))
    assert np.abs(clean.actions[:n] - noisy.actions[:n]).mean() > 0.1
    assert np.abs(noisy.actions).max() <= 1.0  # noise is clipped to the action bounds
    assert noisy.meta["successes"] >= 3


def test_pipeline_command_runs_the_whole_loop(cli, workdir):
    # `make demo` is this command with real budgets; here every stage runs on a tiny one
    res = cli("pipeline", *SIM, *QUIET, "runs_dir=runs", "collect.episodes=2", "collect.num_envs=2", "sft.algo.epochs=3",
              "rl.total_steps=256", "rl.num_envs=2", "rl.algo.rollout_steps=32", "rl.algo.critic_warmup_iters=1",
              "eval.episodes=2")
    assert res.code == 0, res.err
    (root,) = (workdir / "runs" / "pipeline").iterdir()
    summary = json.loads((root / "summary.json").read_text())
    assert list(summary["eval"]) == ["random", "expert", "sft", "sft + rl"]
    assert summary["eval"]["expert"]["success_once"] == 1.0  # the scripted expert solves reach-v3
    for row in summary["eval"].values():
        assert row["episodes"] == 2 and 0.0 <= row["success_once"] <= 1.0
    for step in ("collect", "sft", "rl"):
        assert (root / step / "result.json").is_file()
    assert (root / "rl" / "checkpoints" / "final" / "model.safetensors").is_file()
    assert "rlinf pipeline: metaworld/reach-v3" in res.out
