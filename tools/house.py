"""The house rules of ``rlinf_cli`` (issue 32), measured from the source alone (no imports):

- no import circle between rlinf_cli modules, counting imports inside functions too;
- an import inside a function only where it keeps a heavy dependency (torch, a simulator, Ray,
  gRPC, MLflow, ...) off the import path of its module: the imported module, followed through its
  module-level imports, must reach one; a light module is imported at the top. The one exception
  is the entry point, ``cli.py``: each command loads its own modules when it runs, so that
  ``rlinf --help`` loads none of them (measured: hoisting its light imports costs ~90 ms of ~380);
- no module over 450 lines; no function in stages/, collectors/, runtime/ over 60 lines.

    python tools/house.py          # prints every breach, exit 1 if any

``tests/unit/test_house.py`` runs the same checks in ``make test``.
"""

from __future__ import annotations

import ast
import sys
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1] / "rlinf_cli"
MAX_MODULE_LINES = 450
MAX_FUNCTION_LINES = 60
SHORT_FUNCTIONS_IN = ("stages", "collectors", "runtime")
LAZY_ENTRY = {"rlinf_cli.cli"}  # the command line: --help loads no command's modules
# Third-party packages whose import costs enough (or may be absent) to justify a deferred import.
HEAVY = {"torch", "numpy", "transformers", "mlflow", "deepspeed", "ray", "grpc", "gymnasium", "safetensors",
         "lz4", "pyarrow", "PIL", "imageio", "av", "matplotlib", "tokenizers", "sqlalchemy", "alembic",
         "pandas", "scipy", "mujoco", "metaworld", "libero", "isaaclab", "mani_skill", "hydra", "omegaconf",
         "google", "psutil", "huggingface_hub", "datasets", "accelerate", "peft", "tqdm", "pytest",
         "typer", "rich"}  # typer + rich: ~170 ms, kept off the start-up of pytest's rlinf plugin


@dataclass
class Module:
    name: str
    path: Path
    lines: int
    top: set[str] = field(default_factory=set)  # rlinf_cli modules imported at module level
    top_external: set[str] = field(default_factory=set)  # first names of other packages, module level
    deferred: list[tuple[str, int]] = field(default_factory=list)  # (rlinf_cli module, line) inside functions


def _modules() -> dict[str, Module]:
    out = {}
    for p in sorted(ROOT.rglob("*.py")):
        parts = p.relative_to(ROOT.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out[name] = Module(name, p, len(p.read_text().splitlines()))
    return out


def _targets(mod: str, is_pkg: bool, node: ast.AST, known: dict[str, Module]) -> tuple[list[str], list[str]]:
    """(rlinf_cli modules, other top-level package names) that an import statement loads."""
    names = []
    if isinstance(node, ast.Import):
        names = [a.name for a in node.names]
    else:
        assert isinstance(node, ast.ImportFrom)
        if node.level:
            base = mod.split(".") if is_pkg else mod.split(".")[:-1]
            base = base[:len(base) - (node.level - 1)]
            src = ".".join(base + ([node.module] if node.module else []))
        else:
            src = node.module or ""
        names = [src] + [f"{src}.{a.name}" for a in node.names]
    ours = [n for n in names if n in known]
    # importing a.b.c runs a, a.b first: count the packages too
    for n in list(ours):
        parts = n.split(".")
        ours += [".".join(parts[:i]) for i in range(1, len(parts)) if ".".join(parts[:i]) in known]
    others = [n.split(".")[0] for n in names if n and not n.startswith("rlinf_cli")]
    return sorted(set(ours)), sorted(set(others))


def _scan(known: dict[str, Module]) -> None:
    for m in known.values():
        tree = ast.parse(m.path.read_text())
        is_pkg = m.path.name == "__init__.py"

        def walk(node: ast.AST, in_function: bool) -> None:
            for child in ast.iter_child_nodes(node):
                if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                    walk(child, True)
                elif isinstance(child, (ast.Import, ast.ImportFrom)):
                    ours, others = _targets(m.name, is_pkg, child, known)
                    ours = [o for o in ours if o != m.name]
                    if in_function:
                        m.deferred += [(o, child.lineno) for o in ours]
                    else:
                        m.top.update(ours)
                        m.top_external.update(others)
                elif isinstance(child, ast.If) and _is_type_checking(child):
                    continue  # typing-only imports load nothing at run time
                else:
                    walk(child, in_function)

        walk(tree, False)


def _is_type_checking(node: ast.If) -> bool:
    t = node.test
    return (isinstance(t, ast.Name) and t.id == "TYPE_CHECKING") or (
        isinstance(t, ast.Attribute) and t.attr == "TYPE_CHECKING")


def _heavy(known: dict[str, Module]) -> set[str]:
    """Modules that reach a heavy package through module-level imports."""
    heavy = {n for n, m in known.items() if m.top_external & HEAVY}
    changed = True
    while changed:
        changed = False
        for n, m in known.items():
            if n not in heavy and m.top & heavy:
                heavy.add(n)
                changed = True
    return heavy


def _cycles(known: dict[str, Module]) -> list[list[str]]:
    """Strongly connected components (size > 1) of the graph of all imports, deferred ones included.
    Package __init__ edges that only come from importing a submodule are left out: ``import a.b``
    running ``a/__init__`` is not a circle unless ``a/__init__`` itself imports back."""
    graph = {n: set(m.top) | {d for d, _ in m.deferred} for n, m in known.items()}
    for n in graph:  # drop the implicit parent-package edges added in _targets
        graph[n] = {t for t in graph[n] if not (n.startswith(t + ".") or _only_as_parent(known[n], t))}
    index, low, stack, on, out = {}, {}, [], set(), []

    def strong(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    sys.setrecursionlimit(10000)
    for v in graph:
        if v not in index:
            strong(v)
    return out


def _only_as_parent(m: Module, target: str) -> bool:
    """``target`` is a package that ``m`` reaches only because it imports one of its submodules."""
    text = m.path.read_text()
    return (f"import {target}\n" not in text and f"from {target} import" not in text
            and any(o.startswith(target + ".") for o in m.top | {d for d, _ in m.deferred}))


def _long_functions(known: dict[str, Module]) -> list[str]:
    out = []
    for m in known.values():
        if not any(f"rlinf_cli.{d}" in m.name for d in SHORT_FUNCTIONS_IN):
            continue
        for node in ast.walk(ast.parse(m.path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                n = node.end_lineno - node.lineno + 1
                if n > MAX_FUNCTION_LINES:
                    out.append(f"{m.path.relative_to(ROOT.parent)}:{node.lineno} {node.name}() is {n} lines "
                               f"(at most {MAX_FUNCTION_LINES})")
    return out


def breaches() -> dict[str, list[str]]:
    known = _modules()
    _scan(known)
    heavy = _heavy(known)
    needless = [f"{m.path.relative_to(ROOT.parent)}:{line} imports {target} inside a function, but {target} "
                "reaches no heavy dependency: import it at the top"
                for m in known.values() for target, line in m.deferred
                if target not in heavy and known[target].path.name != "__init__.py" and m.name not in LAZY_ENTRY]
    return {
        "import circles": [" <-> ".join(c) for c in _cycles(known)],
        "needless deferred imports": needless,
        "long modules": [f"{m.path.relative_to(ROOT.parent)} is {m.lines} lines (at most {MAX_MODULE_LINES})"
                         for m in known.values() if m.lines > MAX_MODULE_LINES],
        "long functions": _long_functions(known),
    }


def main() -> None:
    found = breaches()
    for kind, items in found.items():
        print(f"{kind}: {len(items)}")
        for item in items:
            print(f"  {item}")
    sys.exit(1 if any(found.values()) else 0)


if __name__ == "__main__":
    main()
