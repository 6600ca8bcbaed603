"""The rlinf dataset: a directory of parquet chunks plus ``meta.json``.

Readable without rlinf (``pandas.read_parquet(chunk)``). One row per step:

    episode (int64)  step (int32)  obs.<key> (fixed-size list, flattened; text entries: string)  action
    reward (float32)  terminated (bool)  truncated (bool)  success (bool)

``meta.json`` holds the schema version, observation/action spec, provenance of every collect
call, totals, and the sha256 of each chunk. Chunks are written to a temporary file and renamed;
meta.json is replaced atomically after each chunk, so an interrupted collect keeps every chunk
it finished, and appending never rewrites a finished chunk.
"""

from __future__ import annotations

import hashlib
import io
import json
import math
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from rlinf_cli.api import EnvSpec
from rlinf_cli.errors import UserError
from rlinf_cli.locks import FileLock

SCHEMA_VERSION = 1
META = "meta.json"
LOCK = ".lock"  # held by the collect writing the dataset
_CHUNK_RE = re.compile(r"chunk-(\d{6})\.parquet$")


@dataclass
class Episode:
    obs: dict[str, np.ndarray]  # key -> [L, *shape]
    actions: np.ndarray  # [L, *action_shape]
    rewards: np.ndarray  # [L]
    success: np.ndarray  # [L] bool
    terminated: bool
    truncated: bool
    seed: int | None = None

    def __len__(self) -> int:
        return int(self.rewards.shape[0])


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _write_atomic(path: Path, data: bytes) -> None:
    """``data`` written to a temporary file beside ``path``, then renamed over it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        tmp.write_bytes(data)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def _write_json_atomic(path: Path, data: dict[str, Any]) -> None:
    _write_atomic(path, json.dumps(data, indent=2).encode())


def read_meta(path: Path) -> dict[str, Any]:
    meta_file = Path(path) / META
    if not Path(path).exists():
        raise UserError(f"dataset '{path}' does not exist; create it with `rlinf collect output={path}`")
    if not meta_file.is_file():
        raise UserError(f"'{path}' is not an rlinf dataset (no {META}); point to a directory written by `rlinf collect`")
    try:
        meta = json.loads(meta_file.read_text())
        version = meta["schema_version"]
        EnvSpec.from_dict(meta["spec"])
    except (ValueError, KeyError, TypeError) as exc:
        raise UserError(f"{meta_file} is damaged ({type(exc).__name__}: {exc}); re-collect the dataset") from exc
    if version > SCHEMA_VERSION:
        raise UserError(f"dataset '{path}' has schema {version}; this rlinf reads up to {SCHEMA_VERSION}: upgrade rlinf")
    return meta


class WriterBase:
    """What every dataset writer shares (``DatasetWriter``, ``LeRobotWriter``).

    One writer per dataset: a second ``rlinf collect`` into the same output is refused while the
    first runs (an advisory lock, released when the writer's process ends however it ends). The
    metadata only ever describes files that are on disk, and this call's provenance entry appears
    with its first flush. ``next_seed`` (set by the caller as it tries seeds) is recorded with
    every flush, so an appending collect never reuses a seed tried before, kept or not. A
    directory this writer created is removed again if nothing was written to it.
    """

    marker = META  # the file that makes a directory a dataset
    rlinf_meta = META  # the file holding ``self.meta`` (rlinf's bookkeeping)
    per_flush = 50
    kind = "an rlinf dataset"

    def _open(self, path: str | Path, provenance: dict[str, Any]) -> bool:
        """Create or check the directory and take its lock; returns whether the dataset exists."""
        self.path = Path(path)
        self._buffer: list[Any] = []
        self._failed = False
        self.provenance = dict(provenance)  # this call's entry: recorded with its first flush
        self.added = 0  # episodes this writer put on disk
        self.next_seed: int | None = None
        existed = self.path.exists()
        try:
            self.path.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise UserError(f"cannot create the dataset directory '{self.path}': {exc.strerror}; "
                            f"choose a writable output=...") from exc
        self._created = not existed
        # The lock before the look inside: another collect's first chunk, not yet under a marker,
        # would otherwise make its dataset look like a foreign directory.
        lock_path = self.path / LOCK
        lock_existed = lock_path.exists()
        self._lock = FileLock(lock_path).acquire(
            blocking=False, busy=f"dataset '{self.path}' is being written by another rlinf collect (pid {{pid}}); "
                                 f"wait for it to finish or choose another output=")
        if not (self.path / self.marker).exists() and any(p.name != LOCK for p in self.path.iterdir()):
            self._lock.release()
            if not lock_existed:  # leave a foreign directory as it was found
                lock_path.unlink(missing_ok=True)
            raise UserError(f"output '{self.path}' exists and is not {self.kind}; choose an empty or new directory")
        return (self.path / self.marker).exists()

    def _refuse(self, problem: str) -> None:
        self._lock.release()
        raise UserError(f"dataset '{self.path}' holds {problem}; write to a new output directory")

    @property
    def episodes_written(self) -> int:
        return int(self.meta["episodes"])

    def seed_after(self, default: int) -> int:
        """The first seed an appending collect may use: after every seed tried before (datasets
        from before this was recorded: ``default``)."""
        return max(int(self.meta.get("next_seed", default)), default)

    def add(self, episode: Episode) -> None:
        self._buffer.append(episode)
        if len(self._buffer) >= self.per_flush:
            self.flush()

    def flush(self) -> None:
        raise NotImplementedError

    def _book(self, meta: dict[str, Any], episodes: list[Episode]) -> None:
        """Counts, seeds and this call's provenance entry for ``episodes`` in ``meta``."""
        meta["successes"] = int(meta.get("successes", 0)) + sum(bool(e.success.any()) for e in episodes)
        if self.next_seed is not None:
            meta["next_seed"] = int(self.next_seed)
        entry = {**self.provenance, "episodes": self.added + len(episodes)}
        if self.added:
            meta["provenance"][-1] = entry
        else:
            meta["provenance"].append(entry)

    def close(self) -> None:
        """Write what is buffered (and record how far seeds went), then release the dataset."""
        try:
            self.flush()
            if not self._failed and self.next_seed is not None and (self.path / self.marker).exists() \
                    and self.meta.get("next_seed") != self.next_seed:
                self.meta["next_seed"] = int(self.next_seed)  # seeds tried after the last flush
                _write_json_atomic(self.path / self.rlinf_meta, self.meta)
        finally:
            if self._created and not (self.path / self.marker).exists():  # nothing was written: leave nothing
                import shutil

                shutil.rmtree(self.path, ignore_errors=True)
            self._lock.release()


class DatasetWriter(WriterBase):
    """Appends episodes to an rlinf dataset directory, one atomically written chunk at a time."""

    def __init__(self, path: str | Path, spec: EnvSpec, provenance: dict[str, Any], chunk_episodes: int = 50):
        self.spec = spec
        self.per_flush = max(1, chunk_episodes)
        if self._open(path, provenance):
            self.meta = read_meta(self.path)
            if self.meta["spec"] != spec.to_dict():
                self._refuse("another observation/action layout than this simulator")
        else:
            self.meta = {"schema_version": SCHEMA_VERSION, "format": "rlinf-dataset", "spec": spec.to_dict(),
                         "episodes": 0, "steps": 0, "successes": 0, "chunks": [], "provenance": []}
        self.meta_path = self.path / META

    def flush(self) -> None:
        if not self._buffer or self._failed:
            return
        import pyarrow.parquet as pq

        index = self._next_chunk_index()
        name = f"chunk-{index:06d}.parquet"
        first = int(self.meta["episodes"])
        final = self.path / name
        tmp = self.path / f".{name}.tmp-{os.getpid()}"
        meta = json.loads(json.dumps(self.meta))  # committed only once the chunk is on disk
        try:
            pq.write_table(episodes_to_table(self._buffer, self.spec, first), tmp, compression="zstd")
            with open(tmp, "rb") as f:
                os.fsync(f.fileno())
            os.replace(tmp, final)
            steps = sum(len(e) for e in self._buffer)
            meta["chunks"].append({"file": name, "first_episode": first, "episodes": len(self._buffer),
                                   "steps": steps, "sha256": sha256_file(final)})
            meta["episodes"] = first + len(self._buffer)
            meta["steps"] = int(meta["steps"]) + steps
            self._book(meta, self._buffer)
            _write_json_atomic(self.path / META, meta)
        except Exception as exc:
            self._failed = True
            tmp.unlink(missing_ok=True)
            if final.exists() and not any(c["file"] == name for c in self.meta["chunks"]):
                final.unlink(missing_ok=True)  # not in meta.json: as if never written
            if not isinstance(exc, OSError) and not _arrow_io_error(exc):
                raise
            raise UserError(f"cannot write to dataset '{self.path}': {getattr(exc, 'strerror', None) or exc}"
                            f"{_disk_hint(exc)}; it keeps its {self.episodes_written} complete episodes "
                            f"({len(self._buffer)} new ones were lost)") from exc
        self.meta = meta
        self.added += len(self._buffer)
        self._buffer.clear()

    def _next_chunk_index(self) -> int:
        used = [int(m.group(1)) for p in self.path.iterdir() if (m := _CHUNK_RE.search(p.name))]
        used += [int(_CHUNK_RE.search(c["file"]).group(1)) for c in self.meta["chunks"]]
        return max(used, default=-1) + 1


def _arrow_io_error(exc: BaseException) -> bool:
    import pyarrow as pa

    return isinstance(exc, pa.ArrowException) and ("error" in str(exc).lower())


def _disk_hint(exc: BaseException) -> str:
    import errno

    text = str(exc).lower()
    if getattr(exc, "errno", None) in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG) or "too large" in text or "no space" in text:
        return " (disk full or a file-size limit)"
    return ""


def episodes_to_table(episodes: list[Episode], spec: EnvSpec, first_episode: int) -> Any:
    import pyarrow as pa

    lengths = [len(e) for e in episodes]
    cols: dict[str, Any] = {
        "episode": pa.array(np.repeat(np.arange(first_episode, first_episode + len(episodes)), lengths).astype(np.int64)),
        "step": pa.array(np.concatenate([np.arange(n, dtype=np.int32) for n in lengths])),
    }
    for key, s in spec.observation.items():
        values = np.concatenate([e.obs[key] for e in episodes])
        cols[f"obs.{key}"] = pa.array([str(v) for v in values], pa.string()) if s.is_text else _fixed_list(values, s.dtype)
    actions = np.concatenate([e.actions for e in episodes])
    cols["action"] = pa.array(actions.astype(np.int64)) if spec.discrete else _fixed_list(actions, "float32")
    cols["reward"] = pa.array(np.concatenate([e.rewards for e in episodes]).astype(np.float32))
    cols["terminated"] = pa.array(_at_ends(lengths, [e.terminated for e in episodes]))
    cols["truncated"] = pa.array(_at_ends(lengths, [e.truncated for e in episodes]))
    cols["success"] = pa.array(np.concatenate([e.success for e in episodes]).astype(bool))
    return pa.table(cols)


def _at_ends(lengths: Any, flags: list[bool]) -> np.ndarray:
    """A per-step bool column: each episode's flag at its last step, False elsewhere."""
    out = np.zeros(int(np.sum(lengths)), dtype=bool)
    out[np.cumsum(lengths) - 1] = flags
    return out


def _fixed_list(values: np.ndarray, dtype: str) -> Any:
    import pyarrow as pa

    n = values.shape[0]
    size = int(math.prod(values.shape[1:])) if values.ndim > 1 else 1
    flat = np.ascontiguousarray(values, dtype=dtype).reshape(-1)
    return pa.FixedSizeListArray.from_arrays(pa.array(flat), size) if n else pa.array([], pa.list_(pa.from_numpy_dtype(np.dtype(dtype)), size))


@dataclass
class Dataset:
    """A whole dataset in memory as numpy arrays (one row per step)."""

    path: Path
    meta: dict[str, Any]
    spec: EnvSpec
    obs: dict[str, np.ndarray]
    actions: np.ndarray
    rewards: np.ndarray
    episode: np.ndarray
    success: np.ndarray
    terminated: np.ndarray | None = None  # [rows] bool: the episode ended by the env at this step
    truncated: np.ndarray | None = None  # [rows] bool: the episode was cut by a time limit at this step

    @property
    def num_episodes(self) -> int:
        return int(self.meta["episodes"])

    @property
    def episode_success(self) -> dict[int, bool]:
        """Episode index -> whether it succeeded at any step (episodes are contiguous rows)."""
        if not len(self.episode):
            return {}
        starts = np.flatnonzero(np.r_[True, self.episode[1:] != self.episode[:-1]])
        return dict(zip(self.episode[starts].tolist(), np.logical_or.reduceat(self.success, starts).tolist()))


def load(path: str | Path, verify: bool = True) -> Dataset:
    """Read and (by default) checksum every chunk; a damaged chunk is a one-line error."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = Path(path)
    meta = read_meta(path)
    spec = EnvSpec.from_dict(meta["spec"])
    if not meta["chunks"]:
        raise UserError(f"dataset '{path}' has no episodes yet; run `rlinf collect output={path}`")
    raw: list[tuple[str, bytes]] = []
    for chunk in meta["chunks"]:  # every checksum before any parsing: a damaged dataset costs no work
        f = path / chunk["file"]
        if not f.is_file():
            raise UserError(f"dataset '{path}' is missing chunk {chunk['file']}; restore it or re-collect")
        data = f.read_bytes()
        if verify and hashlib.sha256(data).hexdigest() != chunk["sha256"]:
            raise UserError(f"chunk {chunk['file']} of dataset '{path}' fails its sha256 check: the file is corrupt; "
                            f"re-collect the dataset (or restore the chunk)")
        raw.append((chunk["file"], data))
    tables = []
    for name, data in raw:
        try:
            # one thread: chunks are small, and arrow's pool outliving a failed run can abort the exit
            tables.append(pq.read_table(io.BytesIO(data), use_threads=False))
        except (pa.ArrowException, OSError) as exc:
            raise UserError(f"chunk {name} of dataset '{path}' cannot be read ({exc}); re-collect the dataset") from exc
    table = pa.concat_tables(tables)
    n = table.num_rows
    obs = {}
    for key, s in spec.observation.items():
        if s.is_text:
            obs[key] = np.array(table.column(f"obs.{key}").to_pylist(), dtype=object)
            continue
        obs[key] = _column(table, f"obs.{key}").reshape(n, *s.shape).astype(s.dtype)  # a writable copy
    if spec.discrete:
        actions = table.column("action").to_numpy().astype(np.int64)
    else:
        actions = _column(table, "action").reshape(n, *spec.action.shape).astype(np.float32)
    episode = table.column("episode").to_numpy()
    success = table.column("success").to_numpy(zero_copy_only=False)
    ends = {c: table.column(c).to_numpy(zero_copy_only=False).astype(bool) if c in table.column_names else None
            for c in ("terminated", "truncated")}
    return Dataset(path, meta, spec, obs, actions, table.column("reward").to_numpy(), episode, success,
                   ends["terminated"], ends["truncated"])


def _column(table: Any, name: str) -> np.ndarray:
    """A column as one flat numpy array (list columns flattened)."""
    import pyarrow as pa

    col = table.column(name).combine_chunks()
    if pa.types.is_fixed_size_list(col.type) or pa.types.is_list(col.type):
        return col.flatten().to_numpy(zero_copy_only=False)
    return col.to_numpy(zero_copy_only=False)
