"""Bad input through the real CLI: one line, exit 2, no traceback, nothing already written lost."""

from __future__ import annotations

import json
import os
import signal
import subprocess

import pytest

from tests.conftest import RLINF, wait_for_checkpoint


def _one_line_error(res, needle):
    assert res.code == 2, (res.code, res.err)
    lines = [l for l in res.err.splitlines() if l.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and needle in lines[0], res.err
    assert "Traceback" not in res.err


@pytest.fixture
def demos(cli_proc, workdir):
    res = cli_proc("collect", "policy=expert", "episodes=6", "chunk_episodes=3", "output=demos", "tracking.enabled=false")
    assert res.code == 0, res.err
    return workdir / "demos"


def test_corrupt_chunk_is_caught_and_collect_still_appends_safely(cli_proc, demos):
    meta = json.loads((demos / "meta.json").read_text())
    chunk = demos / meta["chunks"][1]["file"]
    data = bytearray(chunk.read_bytes())
    data[100] ^= 0x55
    chunk.write_bytes(bytes(data))
    _one_line_error(cli_proc("sft", "dataset=demos", "tracking.enabled=false"), "fails its sha256 check")
    first = (demos / meta["chunks"][0]["file"]).read_bytes()
    # a different layout is refused without touching the dataset
    _one_line_error(cli_proc("collect", "policy=random", "sim.env_id=Pendulum-v1", "episodes=2", "output=demos",
                             "tracking.enabled=false"), "another observation/action layout")
    assert json.loads((demos / "meta.json").read_text())["chunks"] == meta["chunks"]
    assert (demos / meta["chunks"][0]["file"]).read_bytes() == first


def test_checkpoint_from_another_model_or_sim(cli_proc, demos, workdir):
    res = cli_proc("sft", "dataset=demos", "algo.epochs=1", "eval.episodes=0", "run_dir=sft", "tracking.enabled=false")
    assert res.code == 0, res.err
    ckpt = workdir / "sft/checkpoints/best"
    _one_line_error(cli_proc("eval", f"checkpoint={ckpt}", "sim.env_id=InvertedPendulum-v5", "tracking.enabled=false"),
                    "the simulator expects continuous actions")
    # weights that do not fit the config the checkpoint declares
    cfg = json.loads((ckpt / "config.json").read_text())
    cfg["model"]["hidden_sizes"] = [32, 32]
    (ckpt / "config.json").write_text(json.dumps(cfg))
    _one_line_error(cli_proc("eval", f"checkpoint={ckpt}", "tracking.enabled=false"), "does not match model 'mlp'")
    _one_line_error(cli_proc("rl", f"init={workdir / 'demos'}", "tracking.enabled=false"), "is not an rlinf checkpoint")
    _one_line_error(cli_proc("rl", f"resume={workdir / 'sft/checkpoints/last'}", "tracking.enabled=false"),
                    "cannot be resumed")


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGKILL])
def test_interrupted_run_resumes_from_its_last_checkpoint(workdir, sig):
    args = [RLINF, "rl", "total_steps=400000", "algo.rollout_steps=128", "checkpoint.interval=2", "run_dir=run",
            "progress=false", "eval.episodes=2"]  # 8 envs x 128 steps: 1,024 a iteration
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={**os.environ})
    wait_for_checkpoint(workdir / "run", 4, timeout=120)
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode in ((130,) if sig == signal.SIGINT else (-9,)), (proc.returncode, err)
    if sig == signal.SIGINT:
        assert "Traceback" not in err and "resume with: rlinf rl resume=" in err
    ckpts = sorted(p.name for p in (workdir / "run/checkpoints").iterdir() if p.name.startswith("iter_"))
    last = workdir / "run/checkpoints" / ckpts[-1]
    state = json.loads((last / "trainer_state.json").read_text())
    res = subprocess.run([RLINF, "rl", f"resume={last}", "total_steps=" + str(state["env_steps"] + 2048)],
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    final = json.loads((workdir / "run/checkpoints/final/trainer_state.json").read_text())
    assert final["iteration"] == state["iteration"] + 2  # continued where it stopped, in the same run dir
    result = json.loads((workdir / "run/result.json").read_text())
    # in the same MLflow run, or in its rebuilt copy when the killed run had sent points past the checkpoint
    assert result["mlflow_run_id"] == state["mlflow_run_id"] or "rebuilt from metrics.jsonl" in res.stderr
    rows = [json.loads(line) for line in (workdir / "run/metrics.jsonl").read_text().splitlines()]
    steps = [r["step"] for r in rows if "train/epochs" in r]
    assert steps == sorted(set(steps))  # iterations after the checkpoint were dropped, not duplicated


def test_resume_drops_a_metrics_line_the_killed_run_left_half_written(tmp_path):
    # SIGKILL can land mid-write; resuming must not trip over the torn last line
    from rlinf_cli.tracking import _truncate_metrics

    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 1024, "a": 1}\n{"step": 2048, "a": 2}\n{"step": 3072, "a": 3}\n{"step": 40')
    _truncate_metrics(path, 2048)
    assert [json.loads(line)["step"] for line in path.read_text().splitlines()] == [1024, 2048]
