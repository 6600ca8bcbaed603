"""LeRobot-format datasets (codebase version v3.0): the layout, and the reader (pyarrow and PyAV);
the writer is :mod:`rlinf_cli.data.lerobot_writer`.

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
"""

from __future__ import annotations

import io
import json
import re
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from rlinf_cli.api import TASK_KEY, ArraySpec, EnvSpec
from rlinf_cli.data.dataset import Dataset, _column, sha256_file
from rlinf_cli.errors import UserError
from rlinf_cli.video import decode_mp4

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


def load(path: str | Path, mapping: Mapping[str, str] | None = None, verify: bool = True) -> Any:
    """A LeRobot v3.0 dataset as an rlinf :class:`~rlinf_cli.data.dataset.Dataset`.

    ``mapping`` (rlinf key -> LeRobot feature) overrides the default mapping; features that map
    to no key are left out. Datasets rlinf wrote are checksummed and come back with their exact
    EnvSpec and provenance; others get a spec built from ``meta/info.json``.
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

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
