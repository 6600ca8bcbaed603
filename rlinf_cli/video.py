"""MP4 encoding and decoding through PyAV (FFmpeg's libraries, shipped in its wheels).

One place for the two users of video: LeRobot-format datasets (a camera's frames, many
episodes per file) and evaluation videos (``rlinf eval ... video=N``). PyAV is imported only
when a video is written or read, so runs without video never pay for it.
"""

from __future__ import annotations

import os
from fractions import Fraction
from pathlib import Path
from typing import Any, Iterable

import numpy as np

from rlinf_cli.errors import UserError


def _av() -> Any:
    try:
        import av
    except ImportError as exc:  # pragma: no cover - av is a core dependency
        raise UserError("video needs PyAV: pip install av") from exc
    return av


def encode_mp4(frames: Iterable[np.ndarray] | np.ndarray, path: str | Path, fps: int, *, codec: str = "libx264",
               crf: int = 18, gop: int | None = None, pix_fmt: str | None = None) -> dict[str, Any]:
    """Write ``[H, W, 3]`` uint8 frames to ``path`` (atomically: a temporary file, then rename).

    Frame ``i`` gets the timestamp ``i / fps`` exactly (time base ``1/fps``), which is what
    LeRobot's decoders look frames up by. ``yuv420p`` (what every player plays) needs an even
    width and height; other sizes are written as ``yuv444p`` unless ``pix_fmt`` says otherwise.
    Returns the stream's properties in LeRobot's ``info`` vocabulary.
    """
    av = _av()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}.mp4")
    frames = iter(frames)
    first = next(frames, None)
    if first is None:
        raise ValueError("no frames to encode")
    h, w = int(first.shape[0]), int(first.shape[1])
    if pix_fmt is None:
        pix_fmt = "yuv420p" if h % 2 == 0 and w % 2 == 0 else "yuv444p"
    options = {"crf": str(int(crf))}
    if gop is not None:
        options["g"] = str(int(gop))
    count = 0
    try:
        with av.open(str(tmp), mode="w", format="mp4") as container:
            stream = container.add_stream(codec, rate=int(fps), options=options)
            stream.width, stream.height, stream.pix_fmt = w, h, pix_fmt
            stream.time_base = Fraction(1, int(fps))
            stream.thread_count = 1  # small frames: threads cost more than they save on a shared CPU
            for img in _chain(first, frames):
                frame = av.VideoFrame.from_ndarray(np.ascontiguousarray(img, dtype=np.uint8), format="rgb24")
                frame.pts = count
                frame.time_base = Fraction(1, int(fps))
                container.mux(stream.encode(frame))
                count += 1
            container.mux(stream.encode())
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()
    return {"video.height": h, "video.width": w, "video.codec": _canonical(codec), "video.pix_fmt": pix_fmt,
            "video.is_depth_map": False, "video.fps": int(fps), "video.channels": 3, "has_audio": False,
            "frames": count}


def _chain(first: np.ndarray, rest: Iterable[np.ndarray]) -> Iterable[np.ndarray]:
    yield first
    yield from rest


def _canonical(codec: str) -> str:
    return {"libx264": "h264", "libsvtav1": "av1", "libaom-av1": "av1", "libvpx-vp9": "vp9"}.get(codec, codec)


def decode_mp4(path: str | Path, start: int = 0, stop: int | None = None) -> np.ndarray:
    """Frames ``start .. stop-1`` of an MP4 as ``[T, H, W, 3]`` uint8 (all of them by default)."""
    av = _av()
    out = []
    try:
        with av.open(str(path)) as container:
            stream = container.streams.video[0]
            stream.thread_type = "AUTO"
            for i, frame in enumerate(container.decode(stream)):
                if stop is not None and i >= stop:
                    break
                if i >= start:
                    out.append(frame.to_ndarray(format="rgb24"))
    except (av.error.FFmpegError, OSError) as exc:
        raise UserError(f"cannot decode video {path}: {exc}") from exc
    if not out:
        raise UserError(f"video {path} has no frames in [{start}, {stop}); the file is damaged or truncated")
    return np.stack(out)


def probe(path: str | Path) -> dict[str, Any]:
    """Codec, size, frame rate, frame count and duration of an MP4's video stream."""
    av = _av()
    with av.open(str(path)) as container:
        s = container.streams.video[0]
        frames = s.frames or sum(1 for _ in container.decode(s))
        return {"codec": s.codec_context.name, "width": s.width, "height": s.height, "fps": float(s.average_rate or 0),
                "frames": int(frames), "pix_fmt": s.pix_fmt}
