"""`rlinf plugins new`: copy a plugin template, filling in the names."""

from __future__ import annotations

import keyword
import re
from importlib import resources
from pathlib import Path

from rlinf_cli.errors import UserError

KIND_PREFIX = {"simulator": "rlinf-sim-", "model": "rlinf-model-", "algorithm": "rlinf-algo-",
               "robot": "rlinf-robot-"}  # robot: a simulator plugin whose step drives hardware


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
    values = {"{{name}}": name, "{{package}}": package, "{{dist}}": dist}
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
