"""Reading rich's box tables back from a command's output (tests of terminal tables)."""

from __future__ import annotations


def table_rows(text: str) -> list[list[str]]:
    """The body rows of the rich tables in ``text``, each as the lines it takes. A continuation
    line has an empty first cell, or only the first cell (the label wrapped; every row fills its
    other cells on its first line)."""
    rows: list[list[str]] = []
    for line in text.splitlines():
        if not line.startswith("│"):
            continue
        first, *rest = [c.strip() for c in line.split("│")[1:-1]]
        if rows and (not first or not any(rest)):
            rows[-1].append(line)
        else:
            rows.append([line])
    return rows


def cells(row: list[str]) -> list[str]:
    """A row's cells, each with its lines joined by spaces."""
    parts = [line.split("│")[1:-1] for line in row]
    return [" ".join(p[i].strip() for p in parts if p[i].strip()) for i in range(len(parts[0]))]
