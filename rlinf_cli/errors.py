"""User-facing errors: one clear line, exit code 2, no traceback."""

from __future__ import annotations

from typing import Any

# A word of an error line longer than this is a value echoed back (a 100 KB override): it is
# cut to its first SHOWN_CHARS characters, so the line stays one that a terminal can show.
LONG_WORD = 300
SHOWN_CHARS = 60


class UserError(Exception):
    """Bad input from the user (unknown plugin, bad override, missing or corrupt file).

    The CLI prints ``str(err)`` on one line and exits with code 2. Raise it with a message
    that says what was wrong and what to do about it.
    """

    exit_code = 2


class Interrupted(KeyboardInterrupt):
    """A stage was stopped by a signal (SIGINT: Ctrl-C, or SIGTERM). A subclass of
    KeyboardInterrupt, so every ``except KeyboardInterrupt`` cleanup runs for both signals.

    ``saved``: what the stage kept and, where it can, the command that continues it; the CLI
    prints it in the one line that says the stage stopped (``stopped by SIGTERM: ...``)."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum
        self.saved = ""


def one_line(text: str) -> str:
    return " ".join(str(text).split())


def clip(word: str, limit: int = LONG_WORD) -> str:
    """``word`` itself, or its first characters and how long it was (an echoed 100 KB value)."""
    if len(word) <= limit:
        return word
    return f"{word[:SHOWN_CHARS]}... ({len(word):,} characters)"


def shown(value: Any) -> str:
    """``repr(value)`` for a message, cut like :func:`clip` at :data:`SHOWN_CHARS`."""
    return clip(repr(value), SHOWN_CHARS + 20)


def error_line(message: str) -> str:
    """The line the CLI prints for an error: one line, every over-long word cut."""
    return " ".join(clip(w) for w in str(message).split())


def torch_load_error(path: Any, name: str, exc: BaseException) -> str:
    """What to say when ``torch.load(weights_only=True)`` of checkpoint file ``name`` fails.

    A file that needs pickle is refused and nothing else is suggested: PyTorch's own message
    advises loading it with ``weights_only=False``, which runs whatever code the file holds."""
    text = str(exc)
    if type(exc).__name__ == "UnpicklingError" or "weights only load failed" in text.lower():
        return (f"cannot resume from '{path}': {name} holds Python objects that only pickle can load, and rlinf "
                f"never unpickles checkpoint files (pickle runs code). rlinf reads tensors only: model weights as "
                f"safetensors and {name} as written by `rlinf rl`; resume from a checkpoint rlinf wrote, or start "
                f"a new run from this one's weights with init={path}")
    first = text.splitlines()[0] if text else ""
    return f"cannot resume from '{path}': {name}: {type(exc).__name__}: {first}"
