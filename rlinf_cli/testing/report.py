"""Rows of a contract run: one per check, a failed check a row rather than a crash."""

from __future__ import annotations

import math
from typing import Any, Callable, NamedTuple


class Check(NamedTuple):
    """One contract check: its name, whether it passed, and what it found (or what is wrong)."""

    name: str
    passed: bool
    detail: str = ""


class ContractFailure(AssertionError):
    """Raised by the ``check_*`` functions when a check failed; its message lists every failed check."""

    def __init__(self, label: str, rows: list[Check]):
        self.rows = rows
        failed = [r for r in rows if not r.passed]
        super().__init__(f"{len(failed)} contract check(s) failed for {label}:\n"
                         + "\n".join(f"- {r.name}: {r.detail}" for r in failed))


class Checks:
    """Collects rows: ``checks.run(name, fn)`` runs ``fn`` (returning a detail string) and records it."""

    def __init__(self) -> None:
        self.rows: list[Check] = []

    def run(self, name: str, fn: Callable[[], str | None]) -> bool:
        try:
            self.rows.append(Check(name, True, fn() or ""))
            return True
        except AssertionError as exc:  # the check's own message says what is wrong (its first line:
            # pytest rewrites the asserts of a package with a pytest11 plugin and appends its own lines)
            self.rows.append(Check(name, False, (str(exc).strip().splitlines() or ["assertion failed"])[0]))
        except Exception as exc:
            self.rows.append(Check(name, False, " ".join(f"{type(exc).__name__}: {exc}".split())))
        return False

    def skip(self, name: str, why: str) -> None:
        self.rows.append(Check(name, True, f"skipped: {why}"))


def as_checks(rows: list[tuple[str, bool, str]]) -> list[Check]:
    """``rlinf_cli.checks`` rows (plain tuples) as :class:`Check` rows."""
    return [Check(*r) for r in rows]


def require(label: str, rows: list[Check]) -> list[Check]:
    """``rows`` if every check passed; raises :class:`ContractFailure` naming the failed ones otherwise."""
    if any(not r.passed for r in rows):
        raise ContractFailure(label, rows)
    return rows


def shape_of(x: Any) -> tuple[int, ...] | str:
    shape = getattr(x, "shape", None)
    return tuple(int(d) for d in shape) if shape is not None else type(x).__name__


def finite(value: Any) -> bool:
    try:
        return math.isfinite(float(value))
    except (TypeError, ValueError):
        return True  # not a number (a string diagnostic): nothing to check
