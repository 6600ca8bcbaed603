"""Videos of evaluation episodes: ``rlinf eval ... video=N`` and ``rlinf rl eval.video=N``.

The first N evaluation episodes are run on a simulator whose observations carry camera frames,
recorded and written as mp4 (``<run_dir>/videos/``, also MLflow artifacts under ``videos/``),
one file per episode with its seed, success and return in the name. Frames come from:

- the simulator's optional ``with_video(size) -> (simulator, key) | None`` (Meta-World: the
  configured camera rendered at ``video_size`` under ``"video"``, whatever the policy reads;
  gymnasium's MuJoCo envs with state observations: their camera under ``"rgb"``), or
- the policy's own image observation (a pixel simulator that offers no separate camera).

The remaining episodes run on the unchanged simulator: recording costs nothing when
``video=0`` and only the recorded batches pay for rendering. Episode ``i`` keeps seed
``seed + i`` either way, so the numbers are those of a run without video.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Callable

import numpy as np

from rlinf_cli.api import Obs, StepBatch
from rlinf_cli.errors import UserError


def video_source(sim: Any, size: int) -> tuple[Any, str]:
    """``(simulator to record on, observation key of its frames)``; a clear error if it cannot render."""
    with_video = getattr(sim, "with_video", None)  # optional: (simulator rendering a video camera, its key) or None
    if callable(with_video) and size > 0:
        got = with_video(int(size))
        if got is not None:
            return got
    images = [k for k, s in sim.spec.observation.items() if s.dtype == "uint8" and len(s.shape) == 3 and s.shape[-1] == 3]
    if images:
        return sim, images[0]
    raise UserError(f"this simulator cannot render: its observations have no camera image ({sorted(sim.spec.observation)}) "
                    f"and it offers no video camera; use video=0, or an image observation (e.g. sim.obs=rgb)")


class FrameRecorder:
    """A ``run_episodes`` recorder that keeps one camera's frames of the envs ``0 .. n-1``."""

    def __init__(self, key: str, n: int):
        self.key = key
        self.frames: list[list[np.ndarray]] = [[] for _ in range(n)]

    def __call__(self, t: int, obs: Obs, out: Any, action: np.ndarray, sb: StepBatch, alive: np.ndarray) -> None:
        ended = sb.terminated | sb.truncated
        for i, frames in enumerate(self.frames):
            if alive[i]:
                frames.append(np.array(obs[self.key][i]))
                if ended[i]:  # the frame that shows how the episode ended
                    frames.append(np.array(sb.obs[self.key][i]))


def episode_filename(index: int, episode: Any, has_success: bool = True) -> str:
    success = f"_success-{int(episode.success_once)}" if has_success else ""
    return f"episode-{index:03d}_seed-{episode.seed}{success}_return-{episode.ret:.2f}.mp4"


def evaluate_with_video(evaluator: Any, act: Callable, episodes: int, seed: int, num_envs: int,
                        video: int, out_dir: Path, size: int = 256, fps: int | None = None,
                        on_batch: Callable[[list[Any]], None] | None = None) -> tuple[list[Any], list[Path]]:
    """The evaluator's episodes (its ``sim`` and ``run_episodes``), the first ``video`` of them
    recorded to mp4."""
    from rlinf_cli.video import encode_mp4

    sim = evaluator.sim
    evaluate = evaluator.run_episodes
    video = max(0, min(int(video), int(episodes)))
    if video == 0:
        return evaluate(act, episodes, seed, num_envs, on_batch=on_batch), []
    vsim, key = video_source(sim, size)
    n = max(1, min(num_envs, episodes))
    recorded = min(episodes, math.ceil(video / n) * n)  # whole batches, so seeds line up with a run without video
    recorders: list[FrameRecorder] = []

    def factory() -> FrameRecorder:
        recorders.append(FrameRecorder(key, min(n, video - n * len(recorders))))
        return recorders[-1]

    first = evaluate(act, recorded, seed, num_envs, recorder_factory=factory, on_batch=on_batch, sim=vsim)
    rest = evaluate(act, episodes - recorded, seed + recorded, num_envs, on_batch=on_batch) if episodes > recorded else []
    rate = int(fps or getattr(sim, "fps", None) or 30)
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    for b, rec in enumerate(recorders):
        for i, frames in enumerate(rec.frames):
            index = b * n + i
            if index >= video or not frames:
                continue
            path = out_dir / episode_filename(index, first[index], sim.spec.has_success)
            encode_mp4(frames, path, rate, crf=23)
            paths.append(path)
    return first + rest, paths
