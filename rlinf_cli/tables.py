"""Tables printed on a terminal: short cells, one line per row (two at most on 80 columns).

Whatever is longer than a cell (an instruction, a reason, an install command) goes under the
table as a note, whole: a long text in a cell wraps every row over many lines or gets cut. Torch-free.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

# Embodied results: short headers (a wide header widens its column on every row); the legend says
# which result keys they are.
RESULT_HEADERS = ("episodes", "return", "success", "at end", "length")
RESULT_LEGEND = ("return: mean ± std; success: success_once (at any step); at end: success_at_end "
                 "(at the last step); length: mean steps")


def pct(summary: Mapping[str, float], key: str) -> str:
    return f"{summary[key]:.0%}" if key in summary else "n/a"


def result_cells(s: Mapping[str, float]) -> tuple[str, ...]:
    """The cells under :data:`RESULT_HEADERS` for one summary (``-`` each when it is empty)."""
    if not s:
        return ("-",) * len(RESULT_HEADERS)
    return (f"{int(s['episodes'])}", f"{s['return_mean']:.1f} ± {s['return_std']:.1f}", pct(s, "success_once"),
            pct(s, "success_at_end"), f"{s['length_mean']:.1f}")


def with_notes(table: Any, notes: Sequence[str]) -> Any:
    """``table`` and, under it, one paragraph per note."""
    from rich.console import Group
    from rich.text import Text

    return Group(table, *(Text(n) for n in notes)) if notes else table


def instruction_notes(instructions: Mapping[str, str]) -> list[str]:
    """What each row's episodes were told, as notes under the table; one line when all were told the same."""
    texts = list(dict.fromkeys(instructions.values()))
    if len(texts) == 1:
        return [f"instruction: {texts[0]}"]
    return ["instructions:"] + [f"  {label}: {text}" for label, text in instructions.items()]
