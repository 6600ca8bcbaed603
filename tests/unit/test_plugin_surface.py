"""Plugins (bundled ones and the scaffolds) import the core only through `rlinf_cli.api`, the plugin
surface, so the core's internals can move without breaking a plugin; that surface stays torch-free
to import and every name a plugin takes from it resolves."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PLUGIN_DIRS = ("plugins", "plugins_sims", "plugins_models", "templates")


def _plugin_sources() -> list[Path]:
    return [p for d in PLUGIN_DIRS for p in sorted((REPO / d).rglob("*.py"))
            if "tests" not in p.relative_to(REPO).parts and ".egg-info" not in str(p)]


def _core_imports(path: Path) -> list[tuple[int, str, list[str]]]:
    """(line, module, names) for every import of rlinf_cli or a submodule in ``path``."""
    text = path.read_text()
    if "templates" in path.parts:  # the scaffolds' template fields ({{package}}) are not Python
        text = re.sub(r"\{\{\s*\w+\s*\}\}", "placeholder", text)
    out = []
    for node in ast.walk(ast.parse(text, str(path))):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "rlinf_cli":
            out.append((node.lineno, node.module, [a.name for a in node.names]))
        elif isinstance(node, ast.Import):
            out += [(node.lineno, a.name, []) for a in node.names if a.name.split(".")[0] == "rlinf_cli"]
    return out


def test_the_sources_are_found():
    files = _plugin_sources()
    assert len(files) > 40 and any(p.name == "ppo.py" for p in files)


def test_plugins_import_only_the_plugin_surface():
    offenders = [f"{p.relative_to(REPO)}:{line}: {module}" for p in _plugin_sources()
                 for line, module, _ in _core_imports(p) if module != "rlinf_cli.api"]
    assert not offenders, "import these from rlinf_cli.api instead:\n" + "\n".join(offenders)


def test_every_name_plugins_take_from_the_surface_resolves():
    import rlinf_cli.api as api

    names = {n for p in _plugin_sources() for _, m, ns in _core_imports(p) if m == "rlinf_cli.api" for n in ns}
    assert {"hookimpl", "UserError", "Policy", "Algorithm", "TorchBackend"} <= names
    missing = sorted(n for n in names if not hasattr(api, n))
    assert not missing, missing


def test_an_unknown_name_is_an_attribute_error():
    import rlinf_cli.api as api

    with pytest.raises(AttributeError, match="no attribute 'no_such_name'"):
        api.no_such_name  # noqa: B018


def test_importing_the_surface_does_not_import_torch():
    code = ("import sys; from rlinf_cli.api import hookimpl, UserError, settings, EnvSpec; "
            "print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


def _exported() -> set[str]:
    """The names ``rlinf_cli.api`` exports: those it defines (the contracts) or takes from the core at
    its top, and its surface table."""
    import rlinf_cli.api as api

    tree = ast.parse((REPO / "rlinf_cli" / "api.py").read_text())
    defined = set()
    for node in tree.body:
        if isinstance(node, (ast.ClassDef, ast.FunctionDef)):
            defined.add(node.name)
        elif isinstance(node, ast.Assign):
            defined |= {t.id for t in node.targets if isinstance(t, ast.Name)}
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            defined.add(node.target.id)
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("rlinf_cli"):
            defined |= {a.asname or a.name for a in node.names}  # API_VERSION, kept in the light hookspecs
    return {n for n in defined if not n.startswith("_")} | set(api._SURFACE)


def _documented() -> list[str]:
    """The names in docs/plugins.md's table of the plugin surface (its second column)."""
    text = (REPO / "docs" / "plugins.md").read_text()
    section = text.split("## The plugin surface", 1)[1].split("\n## ", 1)[0]
    rows = [line.split("|") for line in section.splitlines() if line.startswith("| ") and "`" in line]
    return [n for row in rows for n in re.findall(r"`([A-Za-z_][A-Za-z0-9_]*)`", row[2])]


def test_the_documented_surface_is_exactly_what_the_api_exports():
    documented = _documented()
    assert len(documented) == len(set(documented)), sorted(n for n in documented if documented.count(n) > 1)
    exported = _exported()
    assert not set(documented) - exported, f"documented in docs/plugins.md, not exported: {sorted(set(documented) - exported)}"
    assert not exported - set(documented), f"exported by rlinf_cli.api, not documented: {sorted(exported - set(documented))}"


def test_every_exported_name_resolves():
    import rlinf_cli.api as api

    assert not [n for n in _exported() if not hasattr(api, n)]


def test_the_executor_surface_is_small():
    """The core hosts envs; an executor only starts workers (issue 32: it once took 11 names
    from the runtime's internals)."""
    text = (REPO / "docs" / "plugins.md").read_text().split("## The plugin surface", 1)[1]
    row = next(line for line in text.splitlines() if line.startswith("| executor |"))
    assert len(re.findall(r"`(\w+)`", row)) <= 10
