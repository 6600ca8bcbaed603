"""Tiny `rlinf` runs inside this process, for the contracts that need the whole loop (resume, sft)."""

from __future__ import annotations

import io
import json
import os
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path
from typing import Any


class RunFailed(AssertionError):
    """A tiny run exited non-zero; the message is its command and its last error line."""


def rlinf(workdir: Path, *args: str) -> None:
    """``rlinf ARGS`` in ``workdir``, output swallowed; raises :class:`RunFailed` with the error line."""
    from rlinf_cli.cli import main  # typer + rich: kept off the start-up of pytest's rlinf plugin

    out, err = io.StringIO(), io.StringIO()
    before = os.getcwd()
    os.chdir(workdir)
    try:
        with redirect_stdout(out), redirect_stderr(err):
            try:
                main([str(a) for a in args])
                code = 0
            except SystemExit as exc:
                code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    finally:
        os.chdir(before)
    if code != 0:
        lines = [ln for ln in err.getvalue().splitlines() if ln.strip()] or ["(no error output)"]
        raise RunFailed(f"`rlinf {' '.join(map(str, args))}` exited {code}: {lines[-1].strip()}")


def metrics(run_dir: Path) -> list[dict[str, Any]]:
    path = run_dir / "metrics.jsonl"
    assert path.is_file(), f"the run wrote no {path.name}"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def untimed(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Metrics without wall-clock ones (``time/...``), which no two runs share."""
    return [{k: v for k, v in row.items() if not k.startswith("time/")} for row in rows]
