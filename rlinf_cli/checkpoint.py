"""Training checkpoints: policy (safetensors), optimizer, RNG and progress.

Layout of a checkpoint directory::

    model.safetensors  config.json   the policy (Policy.save_pretrained)
    rlinf.yaml                        resolved config of the run that wrote it
    optimizer.pt                      optimizer state (loaded with weights_only=True)
    trainer_state.json                iteration, env steps, metric history
    rng.safetensors                   torch RNG states, so a resumed run continues exactly

A checkpoint is written to a temporary directory and renamed into place, so a run killed
while saving leaves the previous checkpoint intact.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import torch

from rlinf_cli.errors import UserError
from rlinf_cli.policy import Policy, read_model_config

STATE_FILE = "trainer_state.json"
OPTIM_FILE = "optimizer.pt"
RNG_FILE = "rng.safetensors"
CONFIG_YAML = "rlinf.yaml"


def atomic_dir(final: Path) -> Path:
    tmp = final.with_name(f".{final.name}.tmp-{os.getpid()}")
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
    optimizer: torch.optim.Optimizer | None = None,
    state: dict[str, Any] | None = None,
    generator: torch.Generator | None = None,
) -> Path:
    from safetensors.torch import save_file

    tmp = atomic_dir(path)
    policy.save_pretrained(tmp)
    (tmp / CONFIG_YAML).write_text(cfg_yaml)
    if optimizer is not None:
        torch.save(optimizer.state_dict(), tmp / OPTIM_FILE)
    if state is not None:
        (tmp / STATE_FILE).write_text(json.dumps(state))
        rng = {"torch": torch.get_rng_state()}
        if generator is not None:
            rng["generator"] = generator.get_state()
        save_file(rng, str(tmp / RNG_FILE))
    commit_dir(tmp, path)
    return path


def load_training_state(path: Path, optimizer: torch.optim.Optimizer, generator: torch.Generator | None) -> dict[str, Any]:
    """Restore optimizer and RNG from a checkpoint written by :func:`save`; returns the progress dict."""
    from safetensors.torch import load_file

    read_model_config(path)
    missing = [f for f in (STATE_FILE, OPTIM_FILE, RNG_FILE) if not (path / f).is_file()]
    if missing:
        raise UserError(f"'{path}' cannot be resumed: it lacks {', '.join(missing)} (only rl training checkpoints resume)")
    try:
        optimizer.load_state_dict(torch.load(path / OPTIM_FILE, weights_only=True, map_location="cpu"))
        state = json.loads((path / STATE_FILE).read_text())
        rng = load_file(str(path / RNG_FILE))
    except Exception as exc:  # any damage to these files means the same thing to the user
        raise UserError(f"cannot resume from '{path}': {type(exc).__name__}: {str(exc).splitlines()[0]}") from exc
    torch.set_rng_state(rng["torch"])
    if generator is not None and "generator" in rng:
        generator.set_state(rng["generator"])
    return state


def read_config(path: Path) -> dict[str, Any]:
    """The resolved config saved beside a checkpoint (``{}`` if there is none)."""
    from omegaconf import OmegaConf

    f = Path(path) / CONFIG_YAML
    if not f.is_file():
        return {}
    try:
        return OmegaConf.to_container(OmegaConf.load(f), resolve=True)  # type: ignore[return-value]
    except Exception as exc:
        raise UserError(f"'{f}' is not valid YAML ({exc}); the checkpoint is damaged") from exc


def prune(directory: Path, keep: int, prefix: str = "iter_") -> None:
    """Delete all but the ``keep`` newest ``iter_*`` checkpoints."""
    ckpts = sorted(p for p in directory.glob(f"{prefix}*") if p.is_dir())
    for old in ckpts[: max(0, len(ckpts) - keep)]:
        shutil.rmtree(old, ignore_errors=True)


def latest(directory: Path, prefix: str = "iter_") -> Path | None:
    ckpts = sorted(p for p in Path(directory).glob(f"{prefix}*") if p.is_dir())
    return ckpts[-1] if ckpts else None
