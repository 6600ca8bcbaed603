"""Observation codecs: exact round trips, keyframe resync, and the bytes XOR-delta saves."""

from __future__ import annotations

import numpy as np
import pytest

from rlinf_cli.errors import UserError
from rlinf_cli.runtime.codec import CodecConfig, ObsDecoder, ObsEncoder


def _frames(n: int = 6) -> list[dict[str, np.ndarray]]:
    """A slowly changing scene: a static textured background and a small moving square."""
    rng = np.random.default_rng(0)
    background = rng.integers(0, 255, size=(2, 32, 32, 3), dtype=np.uint8)
    frames = []
    for t in range(n):
        img = background.copy()
        img[:, 4 + t:8 + t, 10:14] = 255
        frames.append({"rgb": img, "state": rng.normal(size=(2, 5)).astype(np.float32)})
    return frames


@pytest.mark.parametrize("compression", ["none", "lz4", "zstd"])
@pytest.mark.parametrize("delta", [False, True])
def test_round_trip_is_exact(compression: str, delta: bool) -> None:
    cfg = CodecConfig(compression, delta)
    enc, dec = ObsEncoder(cfg), ObsDecoder(cfg)
    for t, obs in enumerate(_frames()):
        packed, stats = enc.encode(obs, keyframe=t == 0)
        out, _ = dec.decode(packed)
        for k in obs:
            np.testing.assert_array_equal(out[k], obs[k])
            assert out[k].dtype == obs[k].dtype
        assert stats["transport/obs_bytes_raw"] == sum(v.nbytes for v in obs.values())
        assert packed["rgb"].delta == (delta and t > 0)
        assert not packed["state"].delta  # floats are never XOR-ed


def test_keyframe_resynchronises_a_fresh_decoder() -> None:
    cfg = CodecConfig("lz4", True)
    enc = ObsEncoder(cfg)
    frames = _frames()
    for obs in frames[:3]:
        enc.encode(obs)
    dec = ObsDecoder(cfg)  # e.g. the driver after a worker restart
    packed, _ = enc.encode(frames[3])
    with pytest.raises(RuntimeError, match="keyframe"):
        dec.decode(packed)
    packed, _ = enc.encode(frames[4], keyframe=True)
    out, _ = dec.decode(packed)
    np.testing.assert_array_equal(out["rgb"], frames[4]["rgb"])
    packed, _ = enc.encode(frames[5])
    out, _ = dec.decode(packed)
    np.testing.assert_array_equal(out["rgb"], frames[5]["rgb"])


def test_xor_delta_shrinks_slowly_changing_images() -> None:
    sent = {}
    for delta in (False, True):
        enc = ObsEncoder(CodecConfig("lz4", delta))
        total = 0.0
        for t, obs in enumerate(_frames(10)):
            _, stats = enc.encode({"rgb": obs["rgb"]}, keyframe=t == 0)
            total += stats["transport/obs_bytes"] if t else 0.0
        sent[delta] = total
    raw = 9 * _frames(1)[0]["rgb"].nbytes
    assert sent[True] * 4 <= raw  # noise background: plain lz4 cannot compress it, the delta can
    assert sent[True] * 4 <= sent[False]


def test_unknown_codec_is_a_user_error() -> None:
    with pytest.raises(UserError, match="obs_compression"):
        CodecConfig("gzip")
