"""Training checkpoints: policy (safetensors), optimizer, RNG and progress.

Layout of a checkpoint directory::

    model.safetensors  config.json   the policy (Policy.save_pretrained)
    rlinf.yaml                        resolved config of the run that wrote it
    optimizer.pt                      optimizer state (torch engine; loaded with weights_only=True)
    deepspeed/                        optimizer shards, one per rank (DeepSpeed engine)
    trainer_state.json                iteration, env steps, recent episodes, MLflow run id
    rng.safetensors                   torch, numpy and Python RNG states, so a resumed run continues exactly
    env_state.safetensors             per rank: each env's seed stream, episode index, running
                                      return and the actions since its episode began (replayed
                                      on resume; see rlinf_cli/runtime/vector.py)
    normalizer.safetensors            running observation/reward statistics, when the run
                                      normalizes (rlinf_cli/runtime/normalize.py); every stage that
                                      loads the checkpoint uses them

A checkpoint is written to a temporary directory and renamed into place, so a run killed
while saving leaves the previous checkpoint intact. A write that fails (a full disk) removes
the temporary directory and raises :class:`CheckpointWriteError`, one line for the user.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch

from rlinf_cli.errors import UserError
from rlinf_cli.policy import Policy, read_model_config

STATE_FILE = "trainer_state.json"
RNG_FILE = "rng.safetensors"
ENV_FILE = "env_state.safetensors"
CONFIG_YAML = "rlinf.yaml"


class CheckpointWriteError(UserError):
    """Writing a checkpoint failed (disk full, file-size limit, I/O error); nothing of it was kept."""

    def __init__(self, path: Path, exc: BaseException):
        self.path = path
        text = (exc.strerror or str(exc)) if isinstance(exc, OSError) else str(exc)
        why = " ".join((text.strip().splitlines() or [type(exc).__name__])[0].split())[:200]
        hint = " (the disk is full or a file-size limit was hit?)" if _full_disk(exc) else ""
        super().__init__(f"cannot write checkpoint {path}: {why}{hint}; nothing of it was kept and the checkpoints "
                         f"written before are intact")


_STORAGE_WORDS = ("no space", "unexpected pos", "file write failed", "ioerror", "i/o error", "disk quota",
                  "file too large", "streamwriter")


def _causes(exc: BaseException) -> list[BaseException]:
    out: list[BaseException] = []
    while exc is not None and exc not in out and len(out) < 10:
        out.append(exc)
        exc = exc.__cause__ or exc.__context__
    return out


def _storage_failure(exc: BaseException) -> bool:
    """An error of the storage, not of rlinf: an OSError anywhere in the chain, or the words
    torch's and safetensors' writers wrap one in (torch: "unexpected pos" on a full disk)."""
    return any(isinstance(e, OSError) or any(w in str(e).lower() for w in _STORAGE_WORDS) for e in _causes(exc))


def _full_disk(exc: BaseException) -> bool:
    import errno

    full = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)
    return any(isinstance(e, OSError) and e.errno in full or any(w in str(e).lower() for w in
               ("no space", "unexpected pos", "disk quota", "file too large", "storagefull")) for e in _causes(exc))


def atomic_dir(final: Path) -> Path:
    """A fresh temporary directory beside ``final`` (the same name for every rank: a DeepSpeed
    engine writes its shards into it; the run directory's lock keeps other processes out)."""
    tmp = final.with_name(f".{final.name}.tmp")
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    return tmp


def commit_dir(tmp: Path, final: Path) -> None:
    old = None
    if final.exists():
        old = final.with_name(f".{final.name}.old-{os.getpid()}")
        os.replace(final, old)
    os.replace(tmp, final)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def save(
    path: Path,
    policy: Policy,
    cfg_yaml: str,
    engine: Any = None,
    state: dict[str, Any] | None = None,
    generator: torch.Generator | None = None,
    rank_states: list[dict[str, Any]] | None = None,
    rank: int = 0,
    write_files: Any = None,
) -> Path:
    """Write a checkpoint atomically (every rank calls it; rank 0 writes all but the engine's
    shards). ``rank_states[r]``: arrays rank r needs to continue exactly (its rollout state,
    and for ranks > 0 their own RNG states), stored as ``rank<r>.<key>``. ``write_files(dir)``:
    rank 0 writes further files into the checkpoint (the rollout's normalization statistics)."""
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        if rank == 0:
            atomic_dir(path)
        _write(tmp, policy, cfg_yaml, engine, state, generator, rank_states, rank, write_files)
        if rank == 0:
            commit_dir(tmp, path)
    except BaseException as exc:  # a full disk, or a stop (SIGINT/SIGTERM) while writing: no half checkpoint stays
        if rank == 0:
            shutil.rmtree(tmp, ignore_errors=True)
        if isinstance(exc, Exception) and not isinstance(exc, UserError) and _storage_failure(exc):
            raise CheckpointWriteError(path, exc) from exc
        raise
    return path


def _write(tmp: Path, policy: Policy, cfg_yaml: str, engine: Any, state: dict[str, Any] | None,
           generator: torch.Generator | None, rank_states: list[dict[str, Any]] | None, rank: int,
           write_files: Any) -> None:
    """The checkpoint's files, into ``tmp``."""
    from safetensors.torch import save_file

    from rlinf_cli.runtime.dist import barrier

    if engine is not None and state is not None:
        barrier()
        engine.save(tmp)
        barrier()
    if rank != 0:
        return
    policy.save_pretrained(tmp)
    (tmp / CONFIG_YAML).write_text(cfg_yaml)
    if write_files is not None:
        write_files(tmp)
    if state is not None:
        (tmp / STATE_FILE).write_text(json.dumps(state))
        save_file(rng_state(generator), str(tmp / RNG_FILE))
    if rank_states:
        flat = {f"rank{r}.{k}": torch.as_tensor(np.ascontiguousarray(v)) for r, rs in enumerate(rank_states)
                for k, v in rs.items()}
        save_file(flat, str(tmp / ENV_FILE))


def rng_state(generator: torch.Generator | None = None) -> dict[str, torch.Tensor]:
    """Every RNG a training process draws from, as tensors: torch's global one, the update's
    ``generator``, numpy's global one and Python's ``random`` (plugins may use either)."""
    import random

    keys, pos, has_gauss, cached = np.random.get_state()[1:]
    version, internal, gauss_next = random.getstate()
    out = {"torch": torch.get_rng_state(),
           "numpy": torch.from_numpy(np.asarray(keys, dtype=np.int64)),
           "numpy_extra": torch.tensor([pos, has_gauss, cached], dtype=torch.float64),
           "python": torch.tensor(internal, dtype=torch.int64),
           "python_extra": torch.tensor([version, gauss_next is not None, gauss_next or 0.0], dtype=torch.float64)}
    if generator is not None:
        out["generator"] = generator.get_state()
    return out


def set_rng_state(rng: dict[str, torch.Tensor], generator: torch.Generator | None = None, prefix: str = "") -> None:
    """Restore what :func:`rng_state` saved (keys may carry a ``prefix``); absent keys are skipped
    (checkpoints from before they were saved)."""
    import random

    torch.set_rng_state(rng[prefix + "torch"])
    if generator is not None and prefix + "generator" in rng:
        generator.set_state(rng[prefix + "generator"])
    if prefix + "numpy" in rng:
        pos, has_gauss, cached = rng[prefix + "numpy_extra"].tolist()
        np.random.set_state(("MT19937", rng[prefix + "numpy"].numpy().astype(np.uint32), int(pos), int(has_gauss), cached))
    if prefix + "python" in rng:
        version, has_next, gauss_next = rng[prefix + "python_extra"].tolist()
        random.setstate((int(version), tuple(rng[prefix + "python"].tolist()), gauss_next if has_next else None))


def load_rank_state(path: Path, rank: int) -> dict[str, np.ndarray] | None:
    """The arrays :func:`save` stored for ``rank`` (None: the checkpoint has none for it)."""
    from safetensors.torch import load_file

    f = Path(path) / ENV_FILE
    if not f.is_file():
        return None
    try:
        flat = load_file(str(f))
    except Exception as exc:
        raise UserError(f"cannot resume from '{path}': {ENV_FILE} is damaged ({type(exc).__name__}); "
                        f"resume from an earlier checkpoint") from exc
    prefix = f"rank{rank}."
    mine = {k[len(prefix):]: v.numpy() for k, v in flat.items() if k.startswith(prefix)}
    return mine or None


def load_training_state(path: Path, engine: Any, generator: torch.Generator | None) -> dict[str, Any]:
    """Restore the engine's optimizer and the RNGs from a checkpoint written by :func:`save`;
    returns the progress dict."""
    from safetensors.torch import load_file

    read_model_config(path)
    missing = [f for f in (STATE_FILE, RNG_FILE) if not (path / f).is_file()]
    if missing:
        raise UserError(f"'{path}' cannot be resumed: it lacks {', '.join(missing)} (only rl training checkpoints resume)")
    engine.load(path)
    try:
        state = json.loads((path / STATE_FILE).read_text())
        rng = load_file(str(path / RNG_FILE))
    except Exception as exc:  # any damage to these files means the same thing to the user
        raise UserError(f"cannot resume from '{path}': {type(exc).__name__}: {str(exc).splitlines()[0]}") from exc
    set_rng_state(rng, generator)
    return state


def prune(directory: Path, keep: int, prefix: str = "iter_") -> None:
    """Delete all but the ``keep`` newest ``iter_*`` checkpoints."""
    ckpts = sorted(p for p in directory.glob(f"{prefix}*") if p.is_dir())
    for old in ckpts[: max(0, len(ckpts) - keep)]:
        shutil.rmtree(old, ignore_errors=True)


def latest(directory: Path, prefix: str = "iter_") -> Path | None:
    ckpts = sorted(p for p in Path(directory).glob(f"{prefix}*") if p.is_dir())
    return ckpts[-1] if ckpts else None
