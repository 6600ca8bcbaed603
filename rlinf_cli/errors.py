"""User-facing errors: one clear line, exit code 2, no traceback."""

from __future__ import annotations


class UserError(Exception):
    """Bad input from the user (unknown plugin, bad override, missing or corrupt file).

    The CLI prints ``str(err)`` on one line and exits with code 2. Raise it with a message
    that says what was wrong and what to do about it.
    """

    exit_code = 2


def one_line(text: str) -> str:
    return " ".join(str(text).split())
