"""`rlinf export`: a checkpoint's policy, written for use outside rlinf in the format its model
plugin chooses (``Policy.export``: model=hf writes a plain transformers directory, a LoRA adapter
merged into the weights; the default is an rlinf model checkpoint without the training state)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from rlinf_cli.errors import UserError

KEYS = ("checkpoint", "output")


def options(args: list[str]) -> tuple[Path, Path]:
    """(checkpoint, output) from ``checkpoint=PATH output=DIR``; anything else is one line."""
    given: dict[str, str] = {}
    for arg in args:
        key, sep, value = arg.partition("=")
        if not sep or key not in KEYS:
            raise UserError(f"rlinf export takes checkpoint=PATH output=DIR, not '{arg}'")
        given[key] = value.strip().strip("'\"")
    missing = [f"{k}=..." for k in KEYS if not given.get(k)]
    if missing:
        raise UserError(f"rlinf export needs {' and '.join(missing)} (e.g. rlinf export "
                        f"checkpoint=rlinf_runs/rl/<run>/checkpoints/final output=exported/)")
    return Path(given["checkpoint"]), Path(given["output"])


def run(args: list[str]) -> str:
    """Export; returns the line that says what was written where."""
    from rlinf_cli.policy import load_policy, read_model_config

    checkpoint, output = options(args)
    read_model_config(checkpoint)  # a missing or damaged checkpoint says so before anything is written
    if output.is_symlink() or output.exists() and (not output.is_dir() or any(output.iterdir())):
        raise UserError(f"output '{output}' exists and is not an empty directory: name a new one (export never "
                        f"overwrites)")
    policy = load_policy(checkpoint)
    output.parent.mkdir(parents=True, exist_ok=True)
    # written beside the output and renamed into place: a stopped export leaves no half directory
    tmp = output.with_name(f".{output.name}.export-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        what = policy.export(tmp)
        if output.exists():
            output.rmdir()
        os.replace(tmp, output)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return f"exported {checkpoint} to {output}: {what}"
