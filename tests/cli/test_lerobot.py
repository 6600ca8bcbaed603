"""LeRobot v3.0 datasets: rlinf writes them, pandas + PyAV read them, rlinf sft trains on them."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from rlinf_cli.data import dataset as ds, lerobot

SIM = ["sim=metaworld", "sim.task=reach-v3", "sim.max_episode_steps=60", "sim.obs=state_rgb", "sim.image_size=32"]
QUIET = ["progress=false", "tracking.enabled=false"]


@pytest.fixture
def both(cli, workdir):
    """The same 3 expert episodes (same seeds) as an rlinf dataset and as a LeRobot dataset."""
    for fmt in ("rlinf", "lerobot"):
        res = cli("collect", *SIM, *QUIET, "policy=expert", "episodes=3", "num_envs=3", "chunk_episodes=2",
                  f"format={fmt}", f"output={fmt}")
        assert res.code == 0, res.err
    return workdir / "rlinf", workdir / "lerobot"


def test_lerobot_dataset_reads_with_pandas_and_a_video_reader(both):
    import av

    native, root = both
    info = json.loads((root / "meta/info.json").read_text())
    assert info["codebase_version"] == "v3.0" and info["total_episodes"] == 3 and info["fps"] == 80
    feats = info["features"]
    assert feats["observation.state"]["shape"] == [39] and feats["action"]["shape"] == [4]
    assert feats["observation.images.rgb"]["dtype"] == "video" and feats["observation.images.rgb"]["info"]["video.codec"] == "h264"
    tasks = pd.read_parquet(root / "meta/tasks.parquet")
    assert list(tasks.index) == ["reach the goal position"] and list(tasks["task_index"]) == [0]
    data = pd.concat(pd.read_parquet(root / info["data_path"].format(chunk_index=0, file_index=i)) for i in (0, 1))
    episodes = pd.concat(pd.read_parquet(f) for f in sorted((root / "meta/episodes").rglob("*.parquet")))
    assert len(episodes) == 3 and list(data["index"]) == list(range(len(data)))
    assert np.allclose(data["timestamp"], data["frame_index"] / 80)
    ref = ds.load(native)
    np.testing.assert_array_equal(np.stack(data["observation.state"]), ref.obs["state"])  # lossless
    np.testing.assert_array_equal(np.stack(data["action"]), ref.actions)
    assert data.groupby("episode_index")["next.success"].any().all()  # the expert solved every episode
    # every frame of episode 2 from its video file, looked up by timestamp as LeRobot does
    ep = episodes[episodes["episode_index"] == 2].iloc[0]
    video = root / info["video_path"].format(video_key="observation.images.rgb",
                                             chunk_index=ep["videos/observation.images.rgb/chunk_index"],
                                             file_index=ep["videos/observation.images.rgb/file_index"])
    with av.open(str(video)) as container:
        frames = {round(float(f.pts * f.time_base), 4): f.to_ndarray(format="rgb24") for f in container.decode(video=0)}
    rows = data[data["episode_index"] == 2]
    got = np.stack([frames[round(ep["videos/observation.images.rgb/from_timestamp"] + t, 4)] for t in rows["timestamp"]])
    want = ref.obs["rgb"][ref.episode == 2]
    assert got.shape == want.shape == (len(rows), 32, 32, 3)
    # h264 at crf 18, yuv420p (chroma at half resolution: the largest error on 32x32 frames)
    assert np.abs(got.astype(int) - want.astype(int)).mean() < 8.0
    stats = json.loads((root / "meta/stats.json").read_text())
    assert np.allclose(stats["observation.state"]["mean"], ref.obs["state"].mean(0), atol=1e-5)


def test_rlinf_reads_back_what_it_wrote(both):
    native, root = both
    a, b = ds.load(native), lerobot.load(root)
    assert b.spec == a.spec and b.num_episodes == 3
    for key in ("state", "proprio", "task_id"):
        np.testing.assert_array_equal(a.obs[key], b.obs[key])
    np.testing.assert_array_equal(a.actions, b.actions)
    np.testing.assert_array_equal(a.rewards, b.rewards)
    np.testing.assert_array_equal(a.episode, b.episode)
    assert a.episode_success == b.episode_success
    assert np.abs(a.obs["rgb"].astype(int) - b.obs["rgb"].astype(int)).mean() < 8.0
    assert b.meta["provenance"][0]["policy"] == "expert"


def test_sft_on_lerobot_matches_sft_on_the_native_format(both, cli, workdir):
    """Lossless state features: the same training run, loss for loss."""
    for name in ("rlinf", "lerobot"):
        res = cli("sft", *QUIET, f"dataset={name}", "model.obs_keys=[state]", "algo.epochs=4", "eval.episodes=0",
                  f"run_dir=sft_{name}")
        assert res.code == 0, res.err
    curves = [[json.loads(x)["train/loss"] for x in (workdir / f"sft_{n}" / "metrics.jsonl").read_text().splitlines()]
              for n in ("rlinf", "lerobot")]
    assert len(curves[0]) == 4 and curves[0] == curves[1]
    assert "metaworld" in (workdir / "sft_lerobot/checkpoints/best/rlinf.yaml").read_text()  # the simulator came along


def test_appending_adds_files_and_keeps_old_ones(both, cli, workdir):
    _, root = both
    before = {f: f.read_bytes() for f in (root / "data").rglob("*.parquet")}
    res = cli("collect", *SIM, *QUIET, "policy=expert", "episodes=2", "num_envs=2", "format=lerobot", "output=lerobot")
    assert res.code == 0, res.err
    assert all(f.read_bytes() == b for f, b in before.items())
    data = lerobot.load(root)
    assert data.num_episodes == 5 and sorted(np.unique(data.episode)) == list(range(5))
    assert json.loads((root / "meta/info.json").read_text())["total_frames"] == len(data.actions)
    seeds = pd.concat(pd.read_parquet(f) for f in (root / "meta/episodes").rglob("*.parquet"))["seed"]
    assert sorted(seeds) == [0, 1, 2, 3, 4]  # fresh seeds for appended episodes


def test_a_dataset_from_another_tool_maps_features_onto_keys(both, cli, workdir):
    _, root = both
    (root / "meta/rlinf.json").unlink()  # what a dataset recorded elsewhere looks like to rlinf
    data = lerobot.load(root)
    assert set(data.spec.observation) == {"state", "rgb", "proprio", "instruction"}  # one task: no task id
    assert data.spec.observation["instruction"].is_text and data.obs["instruction"][0] == "reach the goal position"
    assert data.spec.action.shape == (4,) and data.spec.has_success
    mapped = lerobot.load(root, {"cam": "observation.images.rgb"})
    assert set(mapped.spec.observation) == {"state", "cam", "proprio", "instruction"}
    res = cli("sft", *QUIET, "dataset=lerobot", "lerobot.features={rgb:observation.images.top}", "algo.epochs=1")
    assert res.code == 2
    assert "no feature 'observation.images.top'" in res.err and "observation.images.rgb" in res.err  # lists the features
    res = cli("sft", *QUIET, "dataset=lerobot", "model.obs_keys=[state]", "algo.epochs=2", "run_dir=s")
    assert res.code == 0, res.err
    assert json.loads((workdir / "s/result.json").read_text())["eval"] == {}  # no simulator recorded: no eval


def test_a_policy_key_missing_from_the_dataset_is_one_clear_line(both, cli, workdir):
    _, root = both
    res = cli("sft", *QUIET, "dataset=rlinf", "model.obs_keys=[rgb,proprio]", "algo.epochs=1", "eval.episodes=0", "run_dir=p")
    assert res.code == 0, res.err
    (root / "meta/rlinf.json").unlink()
    res = cli("sft", *QUIET, "dataset=lerobot", "lerobot.features={cam:observation.images.rgb}",
              f"init={workdir / 'p/checkpoints/best'}", "algo.epochs=1")
    assert res.code == 2 and "reads observation 'rgb'" in res.err and "cam <- observation.images.rgb" in res.err


def test_a_corrupt_video_is_one_line_and_exit_2(both, cli_proc):
    _, root = both
    video = next((root / "videos").rglob("*.mp4"))
    video.write_bytes(video.read_bytes()[: video.stat().st_size // 2])
    res = cli_proc("sft", *QUIET, "dataset=lerobot", "algo.epochs=1")
    assert res.code == 2 and res.err.count("\n") == 1 and "sha256" in res.err
