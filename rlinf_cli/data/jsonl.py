"""JSONL files (prompt/completion data, question/answer tasks) with one-line errors."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Sequence

from rlinf_cli.errors import UserError


def read_rows(path: str | Path, required: Sequence[str], what: str, hint: str, strings: bool = False) -> list[dict[str, Any]]:
    """Rows of a JSONL file that all have the ``required`` fields (string-valued if ``strings``).

    ``what`` names the file in messages (``dataset``, ``sim.path``); ``hint`` says which
    config keys choose the field names. A missing file, a bad line or an empty file is a
    :class:`UserError` naming the line.
    """
    p = Path(path)
    fields = " and ".join(f"'{k}'" for k in required)
    if not p.is_file():
        raise UserError(f"{what} '{path}' does not exist; point it at a JSONL file with {fields} fields")
    rows = []
    for i, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise UserError(f"{path}:{i} is not valid JSON ({exc.msg}); fix or remove that line") from exc
        ok = isinstance(row, dict) and all(k in row and (not strings or isinstance(row[k], str)) for k in required)
        if not ok:
            raise UserError(f"{path}:{i} needs {'string ' if strings else ''}fields {fields} ({hint})")
        rows.append(row)
    if not rows:
        raise UserError(f"{what} '{path}' has no rows")
    return rows
