"""Comments of the configuration YAML files, read as documentation.

Every key of every config file (the core's stage configs and every installed plugin's group
options) carries a comment: at the end of its line, or on the comment lines right above it. The
file's first comment block describes the file. The configuration reference of the docs site is
generated from these comments, and a test fails for a key without one. Two keys are described
by the core instead: ``defaults`` (Hydra's composition list of a stage) and ``name`` (the
registered component a group option belongs to).

The parser reads block-style YAML as these files are written: ``key: value  # comment`` lines,
nested by indentation, flow values (``[a, b]``, ``{}``) on one line. Items of block lists
(``- x``) belong to their key.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from rlinf_cli import DISTRIBUTION
from rlinf_cli.config import CORE_CONF
from rlinf_cli.recommend import DIRNAME
from rlinf_cli.registry import get_registry

IMPLICIT = {"defaults": "Hydra's list of config groups this stage composes (not a setting)",
            "name": "registered name of the component this option configures (set by the group choice)"}
_KEY = re.compile(r"""^(?P<indent>\s*)(?P<key>"[^"]+"|'[^']+'|[^\s#'"\-][^:#]*?|-[^\s:#][^:#]*?)\s*:(?=\s|$)(?P<rest>.*)$""")


@dataclass(frozen=True)
class KeyDoc:
    key: str  # dotted path within the file: "checkpoint.interval"
    value: str  # the default as written (empty for a section)
    comment: str  # "" when undocumented
    line: int  # 1-based
    section: bool  # the key holds nested keys

    @property
    def documented(self) -> bool:
        return bool(self.comment) or self.key.split(".")[-1] in IMPLICIT and "." not in self.key


@dataclass(frozen=True)
class FileDoc:
    path: Path
    description: str  # the file's first comment block
    keys: list[KeyDoc]

    def undocumented(self) -> list[KeyDoc]:
        return [k for k in self.keys if not k.documented]


def _split_comment(text: str) -> tuple[str, str]:
    """``'value  # comment'`` -> ('value', 'comment'), minding quotes."""
    quote = None
    for i, ch in enumerate(text):
        if quote:
            if ch == quote:
                quote = None
        elif ch in "\"'":
            quote = ch
        elif ch == "#" and (i == 0 or text[i - 1].isspace()):
            return text[:i].strip(), text[i + 1:].strip()
    return text.strip(), ""


def parse(path: str | Path) -> FileDoc:
    path = Path(path)
    lines = path.read_text().splitlines()
    header: list[str] = []
    i = 0
    while i < len(lines) and lines[i].lstrip().startswith("#"):
        header.append(lines[i].lstrip()[1:].strip())
        i += 1
    header_end = i  # a key right after the header does not take the header as its comment
    keys: list[KeyDoc] = []
    stack: list[tuple[int, str]] = []  # (indent, key) of the open sections
    pending: list[str] = []
    raw: list[tuple[int, int, str, str, str]] = []  # (line no, indent, key, value, comment)
    for n, line in enumerate(lines, start=1):
        stripped = line.strip()
        if not stripped:
            pending = []
            continue
        if stripped.startswith("#"):
            if n > header_end:
                pending.append(stripped[1:].strip())
            continue
        if stripped.startswith("- ") or stripped == "-":
            pending = []
            continue
        m = _KEY.match(line)
        if not m:
            pending = []
            continue
        indent = len(m.group("indent").expandtabs())
        key = m.group("key").strip().strip("\"'")
        value, comment = _split_comment(m.group("rest"))
        if not comment and pending:
            comment = " ".join(pending)
        pending = []
        raw.append((n, indent, key, value, comment))
    for idx, (n, indent, key, value, comment) in enumerate(raw):
        while stack and stack[-1][0] >= indent:
            stack.pop()
        dotted = ".".join([k for _, k in stack] + [key])
        nxt = raw[idx + 1] if idx + 1 < len(raw) else None
        section = value == "" and nxt is not None and nxt[1] > indent
        keys.append(KeyDoc(dotted, value, comment, n, section))
        if section:
            stack.append((indent, key))
    return FileDoc(path, " ".join(header), keys)


def config_files() -> list[tuple[str, Path]]:
    """``(owner, file)`` for every config YAML of the core and the installed plugins: the
    configs users compose, and each conf dir's renamed-keys table."""
    owners = {CORE_CONF: DISTRIBUTION}
    for spec in get_registry().all_specs():
        if spec.conf_dir is not None:
            owners.setdefault(spec.conf_dir, spec.package)
    out = []
    for conf, owner in owners.items():
        out += [(owner, p) for p in sorted(conf.rglob("*.yaml")) if not is_recommendation(p)]
    return out


def is_recommendation(path: Path) -> bool:
    """A simulator's task recommendations (rlinf_cli/recommend.py) set existing keys; they are
    documented where they are kept (docs/algorithms.md), not as config options."""
    return path.parent.name == DIRNAME
