"""`rlinf check-plugin NAME`: an installed plugin against its kind's contract, as a table.

Exit 0 when every check passes; otherwise one ``error:`` line per failed check on stderr, naming
what is wrong, and exit 2.
"""

from __future__ import annotations

import sys

from rlinf_cli.errors import UserError, error_line
from rlinf_cli.testing.plugins import CONTRACT_KINDS, kinds_of, spec_of, unknown_plugin


def resolve_kind(name: str, kind: str | None) -> str:
    """The kind to check ``name`` as: ``kind`` when given, else the one kind that registers it."""
    if kind is not None:
        if kind not in CONTRACT_KINDS:
            raise UserError(f"unknown plugin kind '{kind}'; choose one of {', '.join(CONTRACT_KINDS)}")

        spec_of(kind, name)  # an unknown name: the registry's one line
        return kind
    kinds = kinds_of(name)
    if not kinds:
        raise unknown_plugin(name)
    if len(kinds) > 1:
        raise UserError(f"'{name}' is registered as a {' and as a '.join(kinds)}; say which with --kind "
                        f"({' or '.join(kinds)})")
    return kinds[0]


def check_plugin(name: str, kind: str | None = None) -> int:
    """Print the table of ``name``'s contract checks; returns the exit code (0 or 2)."""
    from rich.console import Console
    from rich.table import Table

    from rlinf_cli.testing import contract_checks

    kind = resolve_kind(name, kind)
    rows = contract_checks(kind, name)
    table = Table(title=f"rlinf check-plugin: {kind} '{name}'")
    for col in ("check", "result", "detail"):
        table.add_column(col)
    for row in rows:
        table.add_row(row.name, "[green]pass" if row.passed else "[red]FAIL", row.detail)
    Console().print(table)
    failed = [r for r in rows if not r.passed]
    for row in failed:
        print(f"error: {kind} '{name}': {row.name}: {error_line(row.detail)}", file=sys.stderr)
    return 2 if failed else 0
