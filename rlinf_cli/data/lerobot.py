"""LeRobot-format datasets (codebase version v3.0), written and read with pyarrow and PyAV.

The LeRobot library itself does not install beside rlinf (lerobot 0.4.4, the newest release for
Python 3.11, pins ``torch<2.11``), so the documented layout is written directly::

    DIR/meta/info.json                          schema (features), fps, path templates, totals
    DIR/meta/tasks.parquet                      task text (the index) -> task_index
    DIR/meta/stats.json                         mean/std/min/max/count per feature
    DIR/meta/episodes/chunk-000/file-000.parquet  one row per episode: length, tasks, where its rows and frames are
    DIR/data/chunk-000/file-000.parquet         one row per frame, many episodes per file
    DIR/videos/<video key>/chunk-000/file-000.mp4  one camera's frames, many episodes per file
    DIR/meta/rlinf.json                         rlinf's extras: the exact EnvSpec, provenance, sha256 of every file

rlinf observation keys map onto LeRobot features (and back) as documented in docs/dataset.md:
``state`` <-> ``observation.state``; an image key ``k`` (uint8 ``[H, W, 3]``) <->
``observation.images.k`` (an mp4 video); ``task_id`` <-> ``task_index`` (task texts are the
simulator's instructions); any other key ``k`` <-> ``observation.k``. ``action``, ``next.reward``,
``next.done``, ``next.success`` and ``next.truncated`` carry the rest of a step. A dataset from
elsewhere (no ``meta/rlinf.json``) is read by the same rules, or by an explicit mapping
``{rlinf key: feature}``.

Every flush writes one new data file, one new video file per camera and one new episodes file
(each to a temporary name, then renamed), and only then rewrites the metadata: an interrupted
collect keeps every flushed episode, and appending never rewrites a finished file.
"""

from __future__ import annotations

import io
import json
import re
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from rlinf_cli.api import TASK_KEY, ArraySpec, EnvSpec
from rlinf_cli.data.dataset import (WriterBase, _at_ends, _column, _fixed_list, _write_atomic, _write_json_atomic,
                                    sha256_file)
from rlinf_cli.errors import UserError

CODEBASE_VERSION = "v3.0"
INFO = "meta/info.json"
TASKS = "meta/tasks.parquet"
STATS = "meta/stats.json"
RLINF_META = "meta/rlinf.json"
CHUNKS_SIZE = 1000  # files per chunk directory (LeRobot's default)
DATA_PATH = "data/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet"
VIDEO_PATH = "videos/{video_key}/chunk-{chunk_index:03d}/file-{file_index:03d}.mp4"
EPISODES_PATH = "meta/episodes/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet"
_FILE_RE = re.compile(r"chunk-(\d+)/file-(\d+)\.parquet$")
STEP_FEATURES = {  # LeRobot's bookkeeping columns, then rlinf's per-step outcome columns
    "timestamp": "float32", "frame_index": "int64", "episode_index": "int64", "index": "int64", "task_index": "int64",
    "next.reward": "float32", "next.done": "bool", "next.truncated": "bool", "next.success": "bool",
}


def is_lerobot_dataset(path: str | Path) -> bool:
    return (Path(path) / INFO).is_file()


def is_image(spec: ArraySpec) -> bool:
    return spec.dtype == "uint8" and len(spec.shape) == 3 and spec.shape[-1] == 3


def feature_name(key: str, spec: ArraySpec) -> str:
    """The LeRobot feature an rlinf observation key is stored as."""
    if key == "state":
        return "observation.state"
    if is_image(spec):
        return f"observation.images.{key}"
    return f"observation.{key}"


def default_key(feature: str) -> str | None:
    """The rlinf observation key a LeRobot feature maps to by default (None: not an observation)."""
    if feature == "observation.state":
        return "state"
    if feature.startswith("observation."):
        return feature.removeprefix("observation.").removeprefix("images.")
    return None


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

        from rlinf_cli.video import encode_mp4

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


# -- reading ---------------------------------------------------------------------------------------
def load(path: str | Path, mapping: Mapping[str, str] | None = None, verify: bool = True) -> Any:
    """A LeRobot v3.0 dataset as an rlinf :class:`~rlinf_cli.data.dataset.Dataset`.

    ``mapping`` (rlinf key -> LeRobot feature) overrides the default mapping; features that map
    to no key are left out. Datasets rlinf wrote are checksummed and come back with their exact
    EnvSpec and provenance; others get a spec built from ``meta/info.json``.
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    from rlinf_cli.data.dataset import Dataset

    path = Path(path)
    try:
        info = json.loads((path / INFO).read_text())
        features: dict[str, Any] = info["features"]
        fps = int(info["fps"])
        version = str(info["codebase_version"])
    except FileNotFoundError as exc:
        raise UserError(f"'{path}' is not a LeRobot dataset (no {INFO})") from exc
    except (ValueError, KeyError, TypeError) as exc:
        raise UserError(f"{path / INFO} is damaged ({type(exc).__name__}: {exc})") from exc
    if not version.startswith("v3"):
        raise UserError(f"LeRobot dataset '{path}' is {version}; rlinf reads v3.0 (convert it with LeRobot's "
                        f"convert_dataset_v21_to_v30 script)")
    rl_meta = json.loads((path / RLINF_META).read_text()) if (path / RLINF_META).is_file() else None
    if rl_meta is not None and verify:
        for entry in rl_meta["files"]:
            f = path / entry["file"]
            if not f.is_file():
                raise UserError(f"LeRobot dataset '{path}' is missing {entry['file']}; restore it or re-collect")
            if sha256_file(f) != entry["sha256"]:
                raise UserError(f"{entry['file']} of dataset '{path}' fails its sha256 check: the file is corrupt; "
                                f"re-collect the dataset (or restore the file)")
    keymap = _resolve_mapping(features, mapping, rl_meta, path)
    data_files = sorted((path / "data").glob("chunk-*/file-*.parquet"))
    ep_files = sorted((path / "meta" / "episodes").glob("chunk-*/file-*.parquet"))
    if not data_files or not ep_files:
        raise UserError(f"LeRobot dataset '{path}' has no episodes yet")
    try:
        table = pa.concat_tables([pq.read_table(f, use_threads=False) for f in data_files], promote_options="default")
        episodes = pa.concat_tables([pq.read_table(f, use_threads=False) for f in ep_files], promote_options="default")
    except (pa.ArrowException, OSError) as exc:
        raise UserError(f"LeRobot dataset '{path}' cannot be read ({exc}); re-collect or re-download it") from exc
    table = table.sort_by([("index", "ascending")])
    episodes = episodes.sort_by([("episode_index", "ascending")]).to_pydict()
    n = table.num_rows
    episode = table.column("episode_index").to_numpy()
    tasks = _read_tasks(path)
    obs: dict[str, np.ndarray] = {}
    obs_spec: dict[str, ArraySpec] = {}
    for key, feature in keymap.items():
        ft = features[feature]
        if ft["dtype"] in ("video", "image"):
            obs[key] = _video_frames(path, info, feature, table, episodes) if ft["dtype"] == "video" \
                else _image_column(table.column(feature))
            obs_spec[key] = ArraySpec(tuple(obs[key].shape[1:]), "uint8", 0, 255)
        elif ft["dtype"] == "string":  # a text entry (an instruction)
            obs[key] = np.array(table.column(feature).to_pylist(), dtype=object)
            obs_spec[key] = ArraySpec((), "str")
        else:
            shape = tuple(int(x) for x in ft["shape"])
            arr = _column(table, feature).reshape(n, *shape)
            if shape == (1,) and (rl_meta is None or rl_meta["spec"]["observation"].get(key, {}).get("shape") == []):
                arr, shape = arr.reshape(n), ()
            obs[key] = arr.astype(ft["dtype"] if ft["dtype"] not in ("float64",) else "float32")
            obs_spec[key] = ArraySpec(shape, str(obs[key].dtype))

    def optional(name: str, dtype: Any) -> np.ndarray:  # a per-step column, zeros where the dataset has none
        return _column(table, name).reshape(n).astype(dtype) if name in table.column_names else np.zeros(n, dtype)

    task_index = optional("task_index", np.int64)
    act_ft = features.get("action")
    if act_ft is None:
        raise UserError(f"LeRobot dataset '{path}' has no 'action' feature; its features: {sorted(features)}")
    discrete = act_ft["dtype"].startswith("int")
    act_shape = () if discrete else tuple(int(x) for x in act_ft["shape"])
    actions = _column(table, "action").reshape(n, *act_shape).astype(np.int64 if discrete else np.float32)
    rewards, success = optional("next.reward", np.float32), optional("next.success", bool)
    has_success = "next.success" in table.column_names
    if rl_meta is not None:
        spec = EnvSpec.from_dict(rl_meta["spec"])
        if TASK_KEY in spec.observation:
            obs[TASK_KEY] = task_index.astype(np.int64)
        spec = EnvSpec({k: spec.observation[k] for k in [*keymap, *([TASK_KEY] if TASK_KEY in spec.observation else [])]},
                       spec.action, spec.num_actions, spec.max_episode_steps, spec.tasks, spec.has_success)
        provenance = rl_meta.get("provenance", [])
    else:
        task_names = tuple(tasks) if len(tasks) > 1 else ()
        if task_names:
            obs[TASK_KEY] = task_index
            obs_spec[TASK_KEY] = ArraySpec((), "int64", 0, len(task_names) - 1)
        action = ArraySpec((), "int64") if discrete else ArraySpec(tuple(actions.shape[1:]), "float32",
                                                                   float(actions.min()), float(actions.max()))
        spec = EnvSpec(obs_spec, action, int(actions.max()) + 1 if discrete else None,
                       int(max(episodes["length"])), task_names, has_success)
        provenance = []
    meta = {"format": "lerobot", "codebase_version": version, "episodes": len(episodes["episode_index"]), "steps": n,
            "fps": fps, "features": keymap, "tasks": tasks, "provenance": provenance, "spec": spec.to_dict()}
    return Dataset(path, meta, spec, obs, actions, rewards, episode, success)


def _resolve_mapping(features: dict[str, Any], mapping: Mapping[str, str] | None, rl_meta: dict | None,
                     path: Path) -> dict[str, str]:
    """rlinf key -> LeRobot feature for every observation the dataset offers (explicit entries win)."""
    listing = ", ".join(sorted(features))
    if rl_meta is not None:
        keymap = {k: f for k, f in rl_meta["features"].items() if k != "action"}
    else:
        keymap = {k: f for f in features if (k := default_key(f)) is not None}
    for key, feature in (mapping or {}).items():
        if feature not in features:
            raise UserError(f"lerobot.features maps '{key}' to '{feature}', but dataset '{path}' has no feature '{feature}'; "
                            f"its features: {listing}")
        keymap = {k: f for k, f in keymap.items() if f != feature}
        keymap[str(key)] = str(feature)
    if not keymap:
        raise UserError(f"LeRobot dataset '{path}' has no observation features (observation.*); its features: {listing}. "
                        f"Map one with lerobot.features={{<key>:<feature>}}")
    return keymap


def _read_tasks(path: Path) -> list[str]:
    import pandas as pd

    if not (path / TASKS).is_file():
        return []
    df = pd.read_parquet(path / TASKS)
    return [str(t) for t in df.sort_values("task_index").index]


def _image_column(col: Any) -> np.ndarray:
    """LeRobot ``image`` features: PNG/JPEG bytes in a struct column."""
    from PIL import Image

    out = []
    for item in col.to_pylist():
        data = item["bytes"] if isinstance(item, dict) else item
        out.append(np.asarray(Image.open(io.BytesIO(data)).convert("RGB")))
    return np.stack(out)


def _video_frames(path: Path, info: dict[str, Any], feature: str, table: Any, episodes: dict[str, list]) -> np.ndarray:
    """Each data row's frame of camera ``feature``: row ``(episode e, frame i)`` is the frame at
    ``from_timestamp(e) + i / fps`` of the episode's video file."""
    from rlinf_cli.video import decode_mp4

    fps = int(info["fps"])
    template = info.get("video_path") or VIDEO_PATH
    ep_index = table.column("episode_index").to_numpy()
    frame_index = table.column("frame_index").to_numpy()
    where = {e: i for i, e in enumerate(episodes["episode_index"])}
    files: dict[tuple[int, int], np.ndarray] = {}
    h, w = (int(x) for x in info["features"][feature]["shape"][:2])
    out = np.empty((len(ep_index), h, w, 3), dtype=np.uint8)
    for e in np.unique(ep_index):
        i = where.get(int(e))
        if i is None:
            raise UserError(f"episode {e} of dataset '{path}' is not in meta/episodes; the dataset is incomplete")
        key = (int(episodes[f"videos/{feature}/chunk_index"][i]), int(episodes[f"videos/{feature}/file_index"][i]))
        if key not in files:
            f = path / template.format(video_key=feature, chunk_index=key[0], file_index=key[1])
            if not f.is_file():
                raise UserError(f"dataset '{path}' is missing video {f.relative_to(path)}")
            files[key] = decode_mp4(f)
        rows = np.flatnonzero(ep_index == e)
        first = int(round(float(episodes[f"videos/{feature}/from_timestamp"][i]) * fps))
        idx = first + frame_index[rows]
        if idx.max() >= len(files[key]):
            raise UserError(f"video of '{feature}' in dataset '{path}' has {len(files[key])} frames; "
                            f"episode {e} needs frame {int(idx.max())}: the video is truncated")
        out[rows] = files[key][idx]
    return out


def check_keys(keys: Any, data: Any, where: Any) -> None:
    """A policy's observation keys must all be mapped to features of the dataset."""
    missing = [k for k in keys if k not in data.spec.observation]
    if missing:
        mapped = ", ".join(f"{k} <- {f}" for k, f in data.meta["features"].items())
        raise UserError(f"the policy reads observation '{missing[0]}' but LeRobot dataset '{where}' maps none to it "
                        f"(mapped: {mapped}); map a feature with lerobot.features={{{missing[0]}:<feature>}}")


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
