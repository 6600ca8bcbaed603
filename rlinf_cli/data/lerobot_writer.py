"""Writing LeRobot v3.0 datasets (``rlinf collect ... format=lerobot``); the layout and the reader
are :mod:`rlinf_cli.data.lerobot`.

Every flush writes one new data file, one new video file per camera and one new episodes file
(each to a temporary name, then renamed), and only then rewrites the metadata: an interrupted
collect keeps every flushed episode, and appending never rewrites a finished file.
"""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from rlinf_cli.api import TASK_KEY, ArraySpec, EnvSpec
from rlinf_cli.data.dataset import WriterBase, _at_ends, _fixed_list, _write_atomic, _write_json_atomic, sha256_file
from rlinf_cli.data.lerobot import (CHUNKS_SIZE, CODEBASE_VERSION, DATA_PATH, EPISODES_PATH, INFO, RLINF_META, STATS,
                                    STEP_FEATURES, TASKS, VIDEO_PATH, _FILE_RE, feature_name, is_image)
from rlinf_cli.errors import UserError
from rlinf_cli.video import encode_mp4


def _parquet_bytes(table: Any) -> bytes:
    import pyarrow.parquet as pq

    sink = io.BytesIO()
    pq.write_table(table, sink, compression="snappy")
    return sink.getvalue()


class _RunningStats:
    """Count, sum, sum of squares, min and max per feature, merged across flushes."""

    def __init__(self, saved: Mapping[str, Any] | None = None):
        self.acc: dict[str, dict[str, Any]] = {k: {s: np.asarray(v, dtype=np.float64) for s, v in d.items()}
                                               for k, d in (saved or {}).items()}

    def add(self, name: str, values: np.ndarray, axes: tuple[int, ...]) -> None:
        v = values.astype(np.float64)
        part = {"count": np.asarray(float(np.prod([v.shape[a] for a in axes]))), "sum": v.sum(axis=axes),
                "sumsq": (v * v).sum(axis=axes), "min": v.min(axis=axes), "max": v.max(axis=axes)}
        old = self.acc.get(name)
        merge = {"min": np.minimum, "max": np.maximum}  # the rest add up
        self.acc[name] = part if old is None else {s: merge.get(s, np.add)(old[s], v) for s, v in part.items()}

    def saved(self) -> dict[str, Any]:
        return {k: {s: np.asarray(v).tolist() for s, v in d.items()} for k, d in self.acc.items()}

    def lerobot(self, images: set[str]) -> dict[str, Any]:
        """LeRobot's stats.json: images per channel, scaled to [0, 1], shaped [C, 1, 1]."""
        out = {}
        for name, d in self.acc.items():
            n = float(d["count"])
            mean = d["sum"] / n
            std = np.sqrt(np.maximum(d["sumsq"] / n - mean * mean, 0.0))
            stats = {"mean": mean, "std": std, "min": d["min"], "max": d["max"]}
            if name in images:
                stats = {k: (v / 255.0).reshape(-1, 1, 1) for k, v in stats.items()}
            out[name] = {**{k: np.atleast_1d(v).tolist() for k, v in stats.items()}, "count": [int(n)]}
        return out


class LeRobotWriter(WriterBase):
    """Appends episodes to a LeRobot v3.0 dataset directory (the contract of ``WriterBase``)."""

    marker, rlinf_meta, kind = INFO, RLINF_META, "a dataset"

    def __init__(self, path: str | Path, spec: EnvSpec, provenance: dict[str, Any], *, tasks: list[str],
                 fps: int, robot_type: str | None = None, episodes_per_file: int = 50, codec: str = "libx264",
                 crf: int = 18, gop: int | None = 2):
        self.spec = spec
        self.tasks = list(tasks)
        self.fps = int(fps)
        self.per_flush = max(1, int(episodes_per_file))
        self.codec, self.crf, self.gop = codec, int(crf), gop
        self.features = {k: feature_name(k, s) for k, s in spec.observation.items() if k != TASK_KEY}
        self.features["action"] = "action"  # features: rlinf key -> LeRobot feature
        self.videos = [name for _, name, s in self._observed() if is_image(s)]
        p = Path(path)
        if (p / INFO).exists() and not (p / RLINF_META).is_file():
            raise UserError(f"'{p}' is a LeRobot dataset written by another tool; rlinf appends only to "
                            f"its own: write to a new output directory")
        if self._open(p, provenance):
            self.meta = json.loads((self.path / RLINF_META).read_text())
            self.info = json.loads((self.path / INFO).read_text())
            problem = ("another observation/action layout than this simulator" if self.meta["spec"] != spec.to_dict()
                       else f"{self.info['fps']} fps, not {self.fps}" if int(self.info["fps"]) != self.fps else None)
            if problem:
                self._refuse(problem)
            self.tasks = list(dict.fromkeys(self.meta["tasks"] + self.tasks))
        else:
            self.meta = {"format": "rlinf-lerobot", "spec": spec.to_dict(), "features": self.features,
                         "tasks": self.tasks, "episodes": 0, "frames": 0, "successes": 0, "files": [],
                         "provenance": [], "stats": {}}
            self.info = {
                "codebase_version": CODEBASE_VERSION, "robot_type": robot_type, "total_episodes": 0, "total_frames": 0,
                "total_tasks": len(self.tasks), "chunks_size": CHUNKS_SIZE, "data_files_size_in_mb": 100,
                "video_files_size_in_mb": 200, "fps": self.fps, "splits": {}, "data_path": DATA_PATH,
                "video_path": VIDEO_PATH if self.videos else None, "features": self._info_features(),
            }
        self.meta_path = self.path / INFO
        self.stats = _RunningStats(self.meta.get("stats"))

    # -- schema ---------------------------------------------------------------------------------
    def _observed(self) -> list[tuple[str, str, ArraySpec]]:
        """(rlinf key, LeRobot feature, spec) of every observation but the task id."""
        return [(k, self.features[k], s) for k, s in self.spec.observation.items() if k != TASK_KEY]

    def _info_features(self) -> dict[str, Any]:
        feats: dict[str, Any] = {}
        for _, name, s in self._observed():
            if is_image(s):
                feats[name] = {"dtype": "video", "shape": list(s.shape), "names": ["height", "width", "channels"],
                               "info": None}  # filled from the first encoded file
            elif s.is_text:  # an instruction per frame (LeRobot's tasks hold it too)
                feats[name] = {"dtype": "string", "shape": [1], "names": None}
            else:
                feats[name] = {"dtype": s.dtype, "shape": list(s.shape) or [1], "names": None}
        a = self.spec.action
        feats["action"] = {"dtype": "int64", "shape": [1], "names": None} if self.spec.discrete else \
            {"dtype": "float32", "shape": list(a.shape), "names": None}
        for name, dtype in STEP_FEATURES.items():
            feats[name] = {"dtype": dtype, "shape": [1], "names": None}
        return feats

    # -- writing ----------------------------------------------------------------------------------
    def _next_file(self) -> tuple[int, int]:
        used = [int(m.group(1)) * CHUNKS_SIZE + int(m.group(2))
                for p in (self.path / "data").glob("chunk-*/file-*.parquet") if (m := _FILE_RE.search(p.as_posix()))]
        return divmod(max(used, default=-1) + 1, CHUNKS_SIZE)

    def flush(self) -> None:
        if not self._buffer or self._failed:
            return
        try:
            self._flush()
        except OSError as exc:  # disk full, permissions: what is on disk stays a valid dataset
            self._failed = True
            raise UserError(f"cannot write to dataset '{self.path}': {exc.strerror or exc}; it keeps its "
                            f"{self.episodes_written} complete episodes ({len(self._buffer)} new ones were lost)") from exc
        self._buffer.clear()

    def _flush(self) -> None:
        import pyarrow as pa

        eps = list(self._buffer)
        chunk, file = self._next_file()
        where = {"chunk_index": chunk, "file_index": file}
        first_ep, first_frame = int(self.meta["episodes"]), int(self.meta["frames"])
        lengths = np.array([len(e) for e in eps])
        n = int(lengths.sum())
        ends = np.cumsum(lengths)
        starts = ends - lengths
        frame_index = np.concatenate([np.arange(k) for k in lengths]).astype(np.int64)
        task_ids = np.concatenate([self._task_ids(e) for e in eps])
        cols: dict[str, Any] = {}
        written: list[str] = []
        video_meta: dict[str, dict[str, Any]] = {}
        for key, name, s in self._observed():
            values = np.concatenate([e.obs[key] for e in eps])
            if is_image(s):
                rel = VIDEO_PATH.format(video_key=name, **where)
                video_meta[name] = encode_mp4(values, self.path / rel, self.fps, codec=self.codec, crf=self.crf,
                                              gop=self.gop)
                written.append(rel)
                self.stats.add(name, values, (0, 1, 2))
                continue
            if s.is_text:
                cols[name] = pa.array([str(v) for v in values], pa.string())
                continue
            cols[name] = _array(values, s.dtype)
            self.stats.add(name, values.reshape(n, -1), (0,))
        actions = np.concatenate([e.actions for e in eps])
        cols["action"] = pa.array(actions.astype(np.int64)) if self.spec.discrete else _array(actions, "float32")
        self.stats.add("action", actions.reshape(n, -1).astype(np.float64), (0,))
        step_cols = {
            "timestamp": (frame_index / self.fps).astype(np.float32), "frame_index": frame_index,
            "episode_index": np.repeat(np.arange(first_ep, first_ep + len(eps)), lengths).astype(np.int64),
            "index": np.arange(first_frame, first_frame + n, dtype=np.int64), "task_index": task_ids.astype(np.int64),
            "next.reward": np.concatenate([e.rewards for e in eps]).astype(np.float32),
            "next.done": _at_ends(lengths, [e.terminated or e.truncated for e in eps]),
            "next.truncated": _at_ends(lengths, [e.truncated for e in eps]),
            "next.success": np.concatenate([e.success for e in eps]).astype(bool),
        }
        for name, values in step_cols.items():
            cols[name] = pa.array(values)
            if name not in ("next.done", "next.truncated", "next.success"):
                self.stats.add(name, values.reshape(n, 1).astype(np.float64), (0,))
        rel = DATA_PATH.format(**where)
        _write_atomic(self.path / rel, _parquet_bytes(pa.table(cols)))
        written.append(rel)
        def located(prefix: str) -> dict[str, Any]:  # <prefix>/chunk_index, <prefix>/file_index: this flush's files
            return {f"{prefix}/{k}": pa.array([v] * len(eps), pa.int64()) for k, v in where.items()}

        # one row per episode: where its rows and frames are
        ep_cols: dict[str, Any] = {
            "episode_index": pa.array(np.arange(first_ep, first_ep + len(eps), dtype=np.int64)),
            "tasks": pa.array([sorted({self.tasks[t] for t in self._task_ids(e)}) for e in eps], pa.list_(pa.string())),
            "length": pa.array(lengths.astype(np.int64)), **located("data"),
            "dataset_from_index": pa.array(first_frame + starts, pa.int64()),
            "dataset_to_index": pa.array(first_frame + ends, pa.int64()),
        }
        for name in video_meta:
            ep_cols.update(located(f"videos/{name}"))
            ep_cols[f"videos/{name}/from_timestamp"] = pa.array(starts / self.fps, pa.float64())
            ep_cols[f"videos/{name}/to_timestamp"] = pa.array(ends / self.fps, pa.float64())
        ep_cols.update(located("meta/episodes"))
        ep_cols["seed"] = pa.array([e.seed for e in eps], pa.int64())  # rlinf: the reset seed of each episode
        rel = EPISODES_PATH.format(**where)
        _write_atomic(self.path / rel, _parquet_bytes(pa.table(ep_cols)))
        written.append(rel)
        # the metadata last: a reader never sees an episode whose files are not complete
        self.meta["files"].extend({"file": f, "sha256": sha256_file(self.path / f)} for f in written)
        self.meta["episodes"] = first_ep + len(eps)
        self.meta["frames"] = first_frame + n
        self._book(self.meta, eps)
        self.added += len(eps)
        for name, info in video_meta.items():
            if self.info["features"][name].get("info") is None:
                self.info["features"][name]["info"] = {k: v for k, v in info.items() if k != "frames"}
        self._write_meta()

    def _task_ids(self, episode: Any) -> np.ndarray:
        if TASK_KEY in episode.obs:
            return np.asarray(episode.obs[TASK_KEY]).reshape(len(episode)).astype(np.int64)
        return np.zeros(len(episode), dtype=np.int64)

    def _write_meta(self) -> None:
        import pandas as pd
        import pyarrow as pa

        self.meta["tasks"] = self.tasks
        self.meta["stats"] = self.stats.saved()
        tasks = pd.DataFrame({"task_index": np.arange(len(self.tasks), dtype=np.int64)}, index=pd.Index(self.tasks, name="task"))
        _write_atomic(self.path / TASKS, _parquet_bytes(pa.Table.from_pandas(tasks)))  # as DataFrame.to_parquet
        _write_json_atomic(self.path / STATS, self.stats.lerobot(set(self.videos)))
        _write_json_atomic(self.path / RLINF_META, self.meta)
        self.info.update(total_episodes=int(self.meta["episodes"]), total_frames=int(self.meta["frames"]),
                         total_tasks=len(self.tasks), splits={"train": f"0:{int(self.meta['episodes'])}"})
        _write_json_atomic(self.path / INFO, self.info)


def _array(values: np.ndarray, dtype: str) -> Any:
    """Scalars as a plain column (LeRobot's shape [1]), vectors as fixed-size lists."""
    import pyarrow as pa

    return pa.array(np.ascontiguousarray(values, dtype=dtype)) if values.ndim == 1 else _fixed_list(values, dtype)


def writer_for(cfg: Any, sim: Any, provenance: dict[str, Any]) -> LeRobotWriter:
    """The writer ``rlinf collect ... format=lerobot`` uses: task texts are the simulator's
    instructions (or task names), the frame rate its control rate unless ``lerobot.fps`` is set."""
    opts = cfg.get("lerobot") or {}
    spec = sim.spec
    tasks = list(getattr(sim, "instructions", None) or spec.tasks or [str(getattr(sim, "label", None) or cfg.sim.name)])
    fps = opts.get("fps") or getattr(sim, "fps", None) or 30
    return LeRobotWriter(cfg.output, spec, provenance, tasks=tasks, fps=int(fps), robot_type=str(cfg.sim.name),
                         episodes_per_file=int(cfg.chunk_episodes), codec=str(opts.get("codec", "libx264")),
                         crf=int(opts.get("crf", 18)), gop=opts.get("gop", 2))
