"""`rlinf plugins new`: copy a plugin template, filling in the names."""

from __future__ import annotations

import keyword
import re
from importlib import resources
from pathlib import Path

from rlinf_cli.errors import UserError

KIND_PREFIX = {"simulator": "rlinf-sim-", "model": "rlinf-model-", "algorithm": "rlinf-algo-",
               "robot": "rlinf-robot-"}  # robot: a simulator plugin whose step drives hardware


def core_requirement(version: str | None = None) -> str:
    """The dependency a plugin declares on the core: this release series and no later one.

    Plugins import the core's API (``rlinf_cli.api``, ``policy``, ``algorithm``), which may change
    between minor releases while the major version is 0 (and between major releases after that).
    """
    from rlinf_cli import DISTRIBUTION, __version__

    parts = [int(p) for p in re.findall(r"\d+", version or __version__)[:2]] + [0, 0]
    major, minor = parts[0], parts[1]
    upper = f"{major}.{minor + 1}" if major == 0 else f"{major + 1}"
    return f"{DISTRIBUTION}>={major}.{minor},<{upper}"


def new_plugin(name: str, kind: str, directory: str | Path) -> Path:
    if kind not in KIND_PREFIX:
        raise UserError(f"unknown plugin kind '{kind}'; choose one of {', '.join(KIND_PREFIX)}")
    if not re.fullmatch(r"[a-z][a-z0-9_]*", name) or keyword.iskeyword(name):
        raise UserError(f"plugin name '{name}' must be lowercase letters, digits and _ (starting with a letter)")
    dist = KIND_PREFIX[kind] + name.replace("_", "-")
    package = dist.replace("-", "_")
    target = Path(directory) / dist
    if target.exists():
        raise UserError(f"'{target}' already exists; pick another name or directory")
    values = {"{{name}}": name, "{{package}}": package, "{{dist}}": dist, "{{core_requirement}}": core_requirement()}
    template = resources.files("rlinf_cli.templates") / "plugin" / kind
    with resources.as_file(template) as src:
        for path in sorted(Path(src).rglob("*")):
            if path.is_dir() or "__pycache__" in path.parts:
                continue
            rel = str(path.relative_to(src))
            for k, v in values.items():
                rel = rel.replace(k, v)
            text = path.read_text()
            for k, v in values.items():
                text = text.replace(k, v)
            out = target / rel
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_text(text)
    return target
