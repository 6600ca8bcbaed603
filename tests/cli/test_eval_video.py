"""Evaluation videos (eval video=N, rl eval.video=N) and the opt-in MLflow model registry."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest

PIXELS = ["sim=metaworld", "sim.task=reach-v3", "sim.max_episode_steps=30", "sim.obs=rgb", "sim.image_size=64"]


def mlflow_client(workdir: Path):
    from mlflow.tracking import MlflowClient

    return MlflowClient(tracking_uri=f"sqlite:///{workdir / 'rlinf_runs' / 'mlflow.db'}")


def test_eval_video_2_on_metaworld_pixels_writes_two_playable_mp4s(cli, workdir):
    import av

    res = cli("eval", *PIXELS, "checkpoint=random", "episodes=3", "num_envs=2", "video=2", "video_size=128",
              "progress=false", "run_dir=ev")
    assert res.code == 0, res.err
    result = json.loads((workdir / "ev/result.json").read_text())
    files = sorted((workdir / "ev/videos").glob("*.mp4"))
    assert [f.name for f in files] == sorted(Path(v).name for v in result["videos"]) and len(files) == 2
    for i, f in enumerate(files):
        ep = result["per_episode"][i]
        m = re.fullmatch(r"episode-(\d{3})_seed-(\d+)_success-([01])_return-(-?[\d.]+)\.mp4", f.name)
        assert m and int(m[1]) == i and int(m[2]) == ep["seed"] and int(m[3]) == int(ep["success_once"])
        assert float(m[4]) == pytest.approx(ep["ret"], abs=0.01)
        with av.open(str(f)) as container:  # playable: an h264 stream whose frames decode
            stream = container.streams.video[0]
            assert stream.codec_context.name == "h264" and stream.pix_fmt == "yuv420p"
            frames = [fr.to_ndarray(format="rgb24") for fr in container.decode(stream)]
        assert len(frames) == ep["length"] + 1  # every step's observation and the last one
        assert frames[0].shape == (128, 128, 3) and frames[0].std() > 10  # a rendered scene, not a blank frame
    assert len(result["per_episode"]) == 3  # the third episode ran without recording
    artifacts = mlflow_client(workdir).list_artifacts(result["mlflow_run_id"], "videos")
    assert sorted(Path(a.path).name for a in artifacts) == [f.name for f in files]
    assert "video: " in res.err


def test_videos_do_not_change_the_numbers(cli, workdir):
    for run, extra in (("a", []), ("b", ["video=1", "video_size=0"])):  # video_size=0: the policy's own camera
        res = cli("eval", *PIXELS, "checkpoint=random", "episodes=2", "num_envs=2", *extra, "progress=false",
                  "tracking.enabled=false", f"run_dir={run}")
        assert res.code == 0, res.err
    a, b = (json.loads((workdir / r / "result.json").read_text()) for r in "ab")
    assert a["per_episode"] == b["per_episode"]
    assert not (workdir / "a/videos").exists()
    (f,) = (workdir / "b/videos").glob("*.mp4")
    from rlinf_cli.video import probe

    assert probe(f)["width"] == 64  # the 64x64 observation camera


def test_video_on_a_simulator_that_cannot_render_is_one_line(cli_proc):
    res = cli_proc("eval", "sim.env_id=CartPole-v1", "checkpoint=random", "episodes=1", "video=1")
    assert res.code == 2 and res.err.count("\n") == 1 and "cannot render" in res.err


def test_rl_eval_video_records_at_the_final_evaluation(cli, workdir):
    res = cli("rl", "--algo", "ppo", "sim=metaworld", "sim.task=reach-v3", "sim.max_episode_steps=20", "num_envs=2",
              "algo.rollout_steps=16", "total_steps=64", "eval.episodes=2", "eval.video=1", "eval.video_size=64",
              "progress=false", "run_dir=r")
    assert res.code == 0, res.err
    result = json.loads((workdir / "r/result.json").read_text())
    (video,) = result["videos"]
    assert "/videos/final/episode-000_seed-1000000_" in video and Path(video).stat().st_size > 0
    artifacts = mlflow_client(workdir).list_artifacts(result["mlflow_run_id"], "videos/final")
    assert [Path(a.path).name for a in artifacts] == [Path(video).name]


@pytest.fixture
def checkpoint(cli, workdir) -> Path:
    res = cli("collect", "sim=metaworld", "sim.task=reach-v3", "sim.max_episode_steps=60", "policy=expert", "episodes=4",
              "num_envs=4", "output=data", "progress=false", "tracking.enabled=false")
    assert res.code == 0, res.err
    res = cli("sft", "dataset=data", "algo.epochs=2", "eval.episodes=0", "progress=false", "tracking.enabled=false",
              "run_dir=sft")
    assert res.code == 0, res.err
    return workdir / "sft/checkpoints/best"


def test_registry_registers_a_checkpoint_that_met_the_bar(cli, workdir, checkpoint):
    args = ["eval", f"checkpoint={checkpoint}", "episodes=2", "num_envs=2", "progress=false", "register.name=reach-policy"]
    res = cli(*args, "register.metric=length_mean", "register.threshold=1", "run_dir=e1")
    assert res.code == 0, res.err
    reg = json.loads((workdir / "e1/result.json").read_text())["registry"]
    assert reg["registered"] and reg["version"] == 1
    client = mlflow_client(workdir)
    (version,) = client.search_model_versions("name='reach-policy'")
    run_id = json.loads((workdir / "e1/result.json").read_text())["mlflow_run_id"]
    assert version.run_id == run_id and version.source.endswith("/model")
    assert float(version.tags["eval.length_mean"]) >= 1 and "rlinf eval" in version.description
    assert {Path(a.path).name for a in client.list_artifacts(run_id, "model")} >= {"model.safetensors", "config.json"}
    # below the bar: no new version, and the result says why
    res = cli(*args, "register.metric=length_mean", "register.threshold=1e9", "run_dir=e2")
    assert res.code == 0, res.err
    reg = json.loads((workdir / "e2/result.json").read_text())["registry"]
    assert not reg["registered"] and "length_mean" in reg["reason"]
    assert len(client.search_model_versions("name='reach-policy'")) == 1
    assert "not registered as reach-policy" in res.err


@pytest.mark.parametrize("args, needle", [
    (["checkpoint=expert", "register.name=x"], "registers a checkpoint directory"),
    (["checkpoint=random", "register.name=x", "tracking.enabled=false"], "needs MLflow"),
])
def test_registry_bad_options_fail_before_running(cli_proc, args, needle):
    res = cli_proc("eval", "sim=metaworld", "episodes=1", *args)
    assert res.code == 2 and needle in res.err and res.err.count("\n") == 1


def test_a_mujoco_state_env_gets_a_video_camera(cli, workdir):
    res = cli("eval", "sim.env_id=Hopper-v5", "checkpoint=random", "episodes=1", "video=1", "video_size=64",
              "progress=false", "tracking.enabled=false", "run_dir=h")
    assert res.code == 0, res.err
    (f,) = (workdir / "h/videos").glob("*.mp4")
    assert re.fullmatch(r"episode-000_seed-1000000_return-[\d.-]+\.mp4", f.name)  # no success notion: none in the name
    from rlinf_cli.video import decode_mp4

    frames = decode_mp4(f)
    assert frames.shape[1:] == (64, 64, 3) and frames.std() > 5
