"""The dataset format: atomic chunks, append without rewriting, checksums, pandas-readable."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from rlinf_cli.api import ArraySpec, EnvSpec
from rlinf_cli.data import dataset as ds
from rlinf_cli.errors import UserError

SPEC = EnvSpec({"state": ArraySpec((3,), "float32"), "rgb": ArraySpec((4, 4, 3), "uint8")},
               ArraySpec((2,), "float32", -1.0, 1.0), has_success=True)


def _episode(rng: np.random.Generator, length: int) -> ds.Episode:
    return ds.Episode(
        obs={"state": rng.normal(size=(length, 3)).astype(np.float32),
             "rgb": rng.integers(0, 255, size=(length, 4, 4, 3), dtype=np.uint8)},
        actions=rng.uniform(-1, 1, size=(length, 2)).astype(np.float32),
        rewards=rng.normal(size=length).astype(np.float32),
        success=np.r_[np.zeros(length - 1, bool), True], terminated=True, truncated=False)


def _write(path, episodes, chunk=2):
    w = ds.DatasetWriter(path, SPEC, {"policy": "test"}, chunk_episodes=chunk)
    for e in episodes:
        w.add(e)
    w.close()
    return w


def test_round_trip_and_pandas_readable(tmp_path):
    rng = np.random.default_rng(0)
    eps = [_episode(rng, n) for n in (3, 5, 4)]
    _write(tmp_path / "d", eps)
    data = ds.load(tmp_path / "d")
    assert data.num_episodes == 3 and data.actions.shape == (12, 2)
    np.testing.assert_array_equal(data.obs["rgb"][3:8], eps[1].obs["rgb"])
    np.testing.assert_allclose(data.obs["state"][8:], eps[2].obs["state"])
    meta = json.loads((tmp_path / "d" / "meta.json").read_text())
    assert meta["schema_version"] == 1 and len(meta["chunks"]) == 2 and meta["successes"] == 3
    df = pd.read_parquet(tmp_path / "d" / meta["chunks"][0]["file"])  # no rlinf needed
    assert list(df.columns[:2]) == ["episode", "step"] and len(df["obs.state"].iloc[0]) == 3


def test_append_keeps_finished_chunks_byte_identical(tmp_path):
    rng = np.random.default_rng(1)
    _write(tmp_path / "d", [_episode(rng, 3), _episode(rng, 3)])
    first = (tmp_path / "d" / "chunk-000000.parquet").read_bytes()
    _write(tmp_path / "d", [_episode(rng, 2)])
    assert (tmp_path / "d" / "chunk-000000.parquet").read_bytes() == first
    data = ds.load(tmp_path / "d")
    assert data.num_episodes == 3 and sorted(set(data.episode.tolist())) == [0, 1, 2]
    assert len(data.meta["provenance"]) == 2


def test_orphan_chunk_from_a_crash_is_never_overwritten(tmp_path):
    rng = np.random.default_rng(2)
    _write(tmp_path / "d", [_episode(rng, 3), _episode(rng, 3)])
    (tmp_path / "d" / "chunk-000001.parquet").write_bytes(b"left by a killed run")
    _write(tmp_path / "d", [_episode(rng, 2)])
    assert (tmp_path / "d" / "chunk-000001.parquet").read_bytes() == b"left by a killed run"
    assert ds.load(tmp_path / "d").num_episodes == 3


def test_corrupt_chunk_fails_its_checksum(tmp_path):
    rng = np.random.default_rng(3)
    _write(tmp_path / "d", [_episode(rng, 3), _episode(rng, 3)])
    chunk = tmp_path / "d" / "chunk-000000.parquet"
    raw = bytearray(chunk.read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    chunk.write_bytes(bytes(raw))
    with pytest.raises(UserError, match="fails its sha256 check"):
        ds.load(tmp_path / "d")


def test_appending_another_layout_is_refused_and_keeps_data(tmp_path):
    rng = np.random.default_rng(4)
    _write(tmp_path / "d", [_episode(rng, 3)])
    before = (tmp_path / "d" / "meta.json").read_text()
    other = EnvSpec({"state": ArraySpec((5,), "float32")}, ArraySpec((), "int64"), num_actions=2)
    with pytest.raises(UserError, match="another observation/action layout"):
        ds.DatasetWriter(tmp_path / "d", other, {"policy": "x"})
    assert (tmp_path / "d" / "meta.json").read_text() == before
    assert ds.load(tmp_path / "d").num_episodes == 1


def test_not_a_dataset_and_damaged_meta(tmp_path):
    (tmp_path / "junk").mkdir()
    (tmp_path / "junk" / "file.txt").write_text("x")
    with pytest.raises(UserError, match="not an rlinf dataset"):
        ds.load(tmp_path / "junk")
    with pytest.raises(UserError, match="exists and is not an rlinf dataset"):
        ds.DatasetWriter(tmp_path / "junk", SPEC, {})
    assert sorted(p.name for p in (tmp_path / "junk").iterdir()) == ["file.txt"]  # left as found
    (tmp_path / "junk" / "meta.json").write_text("{not json")
    with pytest.raises(UserError, match="damaged"):
        ds.load(tmp_path / "junk")


def test_a_dataset_mid_first_chunk_is_busy_not_foreign(tmp_path):
    """A second writer that arrives while the first has a chunk on disk but no metadata yet
    (CI saw this race between two collects) is told the dataset is busy, and the first
    writer's files stay."""
    from rlinf_cli.locks import FileLock

    (tmp_path / "d").mkdir()
    held = FileLock(tmp_path / "d" / ds.LOCK).acquire()
    (tmp_path / "d" / "chunk-000000.parquet").write_bytes(b"part")
    try:
        with pytest.raises(UserError, match="being written by another rlinf collect"):
            ds.DatasetWriter(tmp_path / "d", SPEC, {})
    finally:
        held.release()
    assert (tmp_path / "d" / "chunk-000000.parquet").read_bytes() == b"part"
