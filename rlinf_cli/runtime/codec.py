"""Observation transport codecs: none, lz4, zstd, with optional XOR-delta for uint8 images.

An env worker encodes the observations of its envs before they cross a process or machine
boundary; the driver decodes them. Encoder and decoder are a matched, stateful pair per stream
(one per worker shard): XOR-delta sends ``frame ^ previous_frame``, which is mostly zero bytes
for camera images of a slowly moving scene and so compresses far better than the frame itself.
Every message says whether it is a delta, so a keyframe (after reset or a worker restart)
resynchronises the decoder.

Floating-point observations are never XOR-ed: their low mantissa bits change every step, so a
delta buys nothing there.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

from rlinf_cli.errors import UserError

CODECS = ("none", "lz4", "zstd")


@dataclass(frozen=True)
class CodecConfig:
    compression: str = "none"  # none | lz4 | zstd
    delta: bool = False  # XOR uint8 observations against the previous frame before compressing
    level: int = 1  # zstd level (1 is fast; higher levels buy little on images)

    def __post_init__(self) -> None:
        if self.compression not in CODECS:
            raise UserError(f"env.obs_compression must be one of {', '.join(CODECS)}, got '{self.compression}'")


class Packed(NamedTuple):
    """One encoded observation array."""

    shape: tuple[int, ...]
    dtype: str  # numpy dtype string, or TEXT_DTYPE
    delta: bool  # data is XOR against the stream's previous frame
    data: Any  # bytes (compressed) or np.ndarray (codec none)
    nbytes: int = 0  # text entries: length of the UTF-8 JSON before compression


TEXT_DTYPE = "str"  # text entries (numpy object arrays of strings) travel as UTF-8 JSON: no pickle


class _Compressor:
    """``compress(array) -> bytes`` and ``decompress(data, nbytes) -> bytes`` of one codec."""

    def __init__(self, name: str, level: int):
        if name == "lz4":
            import lz4.block

            self._c = lambda b: lz4.block.compress(b, store_size=False)
            self.decompress = lambda b, n: lz4.block.decompress(b, uncompressed_size=n)
        elif name == "zstd":
            import zstandard

            comp = zstandard.ZstdCompressor(level=level)
            decomp = zstandard.ZstdDecompressor()
            self._c = comp.compress
            self.decompress = lambda b, n: decomp.decompress(b, max_output_size=n)

    def compress(self, arr: np.ndarray) -> bytes:
        return self._c(memoryview(np.ascontiguousarray(arr)).cast("B"))


class ObsEncoder:
    """Worker side: obs dict -> dict of :class:`Packed`, plus byte and time counters."""

    def __init__(self, cfg: CodecConfig):
        self.cfg = cfg
        self._comp = _Compressor(cfg.compression, cfg.level) if cfg.compression != "none" else None
        self._prev: dict[str, np.ndarray] = {}

    def encode(self, obs: dict[str, np.ndarray], keyframe: bool = False) -> tuple[dict[str, Packed], dict[str, float]]:
        t0 = time.perf_counter()
        raw = sent = 0
        out: dict[str, Packed] = {}
        for key, arr in obs.items():
            if arr.dtype == object:  # text entries
                text = json.dumps(arr.tolist()).encode()
                data = self._comp.compress(np.frombuffer(text, np.uint8)) if self._comp is not None else text
                raw, sent = raw + len(text), sent + len(data)
                out[key] = Packed(tuple(arr.shape), TEXT_DTYPE, False, data, len(text))
                continue
            raw += arr.nbytes
            keep = self.cfg.delta and arr.dtype == np.uint8
            prev = self._prev.get(key) if keep else None
            use_delta = prev is not None and not keyframe and prev.shape == arr.shape
            # the delta is computed in the previous frame's buffer, which then takes this frame
            payload = np.bitwise_xor(arr, prev, out=prev) if use_delta else arr
            if self._comp is not None:
                data: Any = self._comp.compress(payload)
                sent += len(data)
            else:
                data = payload.copy() if use_delta else arr
                sent += arr.nbytes
            if keep:
                if prev is None or prev.shape != arr.shape:
                    self._prev[key] = arr.copy()
                else:
                    np.copyto(prev, arr)
            out[key] = Packed(tuple(arr.shape), arr.dtype.str, use_delta, data)
        stats = {"transport/obs_bytes_raw": float(raw), "transport/obs_bytes": float(sent),
                 "transport/encode_s": time.perf_counter() - t0}
        return out, stats


class ObsDecoder:
    """Driver side: the inverse of one :class:`ObsEncoder` stream."""

    def __init__(self, cfg: CodecConfig):
        self.cfg = cfg
        self._comp = _Compressor(cfg.compression, cfg.level) if cfg.compression != "none" else None
        self._prev: dict[str, np.ndarray] = {}

    def reset(self) -> None:
        """Forget the previous frames (the encoder restarted; its next message is a keyframe)."""
        self._prev.clear()

    def decode(self, packed: dict[str, Packed], out: dict[str, np.ndarray] | None = None) -> tuple[dict[str, np.ndarray], float]:
        """Decode into ``out`` (arrays of the right shape) when given; returns (obs, seconds)."""
        t0 = time.perf_counter()
        result: dict[str, np.ndarray] = {}
        for key, p in packed.items():
            dtype = np.dtype(object if p.dtype == TEXT_DTYPE else p.dtype)
            dst = result[key] = out[key] if out is not None else np.empty(p.shape, dtype=dtype)
            if p.dtype == TEXT_DTYPE:
                data = self._comp.decompress(p.data, p.nbytes) if self._comp is not None else p.data
                dst[...] = np.array(json.loads(bytes(data)), dtype=object).reshape(p.shape)
                continue
            if self._comp is not None:
                nbytes = int(np.prod(p.shape, dtype=np.int64)) * dtype.itemsize
                arr = np.frombuffer(self._comp.decompress(p.data, nbytes), dtype=dtype).reshape(p.shape)
            else:
                arr = np.asarray(p.data)
            if p.delta:
                prev = self._prev.get(key)
                if prev is None:
                    raise RuntimeError(f"observation '{key}': a delta frame arrived without a keyframe")
                np.bitwise_xor(arr, prev, out=dst)
            else:
                np.copyto(dst, arr)
            if self.cfg.delta and dtype == np.uint8:
                prev = self._prev.get(key)
                if prev is None or prev.shape != dst.shape:
                    self._prev[key] = dst.copy()
                else:
                    np.copyto(prev, dst)
        return result, time.perf_counter() - t0
