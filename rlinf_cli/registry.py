"""Plugin discovery through the ``rlinf`` entry-point group.

Bundled plugins register exactly like third-party ones: the core never names them.
"""

from __future__ import annotations

import difflib
import importlib
import os
import sys
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any, Callable

import pluggy

from rlinf_cli import hookspecs
from rlinf_cli.errors import UserError

ENTRY_POINT_GROUP = "rlinf"


@dataclass(frozen=True)
class Kind:
    name: str  # "simulator"
    hook: str  # "register_simulators"
    group: str  # the Hydra config group: "sim"
    package_hint: str  # pip package naming convention for a missing name


KINDS: dict[str, Kind] = {
    k.name: k
    for k in (
        Kind("simulator", "register_simulators", "sim", "rlinf-sim-{name}"),
        Kind("model", "register_models", "model", "rlinf-model-{name}"),
        Kind("algorithm", "register_algorithms", "algo", "rlinf-algo-{name}"),
        Kind("accelerator", "register_accelerators", "accelerator", "rlinf-accel-{name}"),
        Kind("executor", "register_executors", "executor", "rlinf-executor-{name}"),
    )
}
GROUP_TO_KIND = {k.group: k.name for k in KINDS.values()}


@dataclass(frozen=True)
class Spec:
    """One registered component."""

    kind: str
    name: str
    factory: str  # "module:attr", imported on first use
    summary: str = ""
    default: bool = False
    package: str = "?"
    version: str = "?"
    conf_dir: Path | None = None
    attrs: dict[str, Any] = field(default_factory=dict)

    def load(self) -> Any:
        """Import and return the factory object."""
        module_name, _, attr = self.factory.partition(":")
        try:
            obj = importlib.import_module(module_name)
            for part in attr.split(".") if attr else []:
                obj = getattr(obj, part)
        except (ImportError, AttributeError) as exc:
            raise UserError(
                f"{self.kind} '{self.name}' from package {self.package} failed to load "
                f"({type(exc).__name__}: {exc}); reinstall it with `pip install -U {self.package}`"
            ) from exc
        return obj


class Registry:
    def __init__(self, pm: pluggy.PluginManager, dists: dict[int, tuple[str, str]] | None = None):
        self.pm = pm
        self._dists = dists or {}
        self._specs: dict[str, dict[str, Spec]] = {k: {} for k in KINDS}
        self.load_errors: list[str] = []
        self._collect()

    def _collect(self) -> None:
        for kind in KINDS.values():
            for impl in getattr(self.pm.hook, kind.hook).get_hookimpls():
                package, version = self._dists.get(id(impl.plugin), (self.pm.get_name(impl.plugin), "?"))
                conf_dir = _conf_dir_of(impl.plugin)
                impl.function(register=self._registrar(kind.name, package, version, conf_dir))

    def _registrar(self, kind: str, package: str, version: str, conf_dir: Path | None) -> Callable:
        def register(name: str, factory: str, *, summary: str = "", default: bool = False, **attrs: Any) -> None:
            existing = self._specs[kind].get(name)
            if existing is not None:
                raise RuntimeError(
                    f"duplicate {kind} name '{name}': registered by {existing.package} and by {package}; "
                    f"uninstall one of them"
                )
            if ":" not in factory:
                raise RuntimeError(f"{kind} '{name}' from {package}: factory must be 'module:attr', got {factory!r}")
            self._specs[kind][name] = Spec(kind, name, factory, summary, default, package, version, conf_dir, attrs)

        return register

    # -- queries ---------------------------------------------------------------------------
    def specs(self, kind: str) -> dict[str, Spec]:
        return dict(self._specs[kind])

    def all_specs(self) -> list[Spec]:
        return [s for kind in KINDS for s in self._specs[kind].values()]

    def get(self, kind: str, name: str) -> Spec:
        spec = self._specs[kind].get(name)
        if spec is None:
            raise UserError(unknown_name_message(kind, name, sorted(self._specs[kind])))
        return spec

    def load(self, kind: str, name: str) -> Any:
        return self.get(kind, name).load()

    def default(self, kind: str) -> str | None:
        defaults = [s.name for s in self._specs[kind].values() if s.default]
        return sorted(defaults)[0] if defaults else None

    def conf_dirs(self) -> list[Path]:
        dirs: list[Path] = []
        for spec in self.all_specs():
            if spec.conf_dir is not None and spec.conf_dir not in dirs:
                dirs.append(spec.conf_dir)
        return dirs

    def plugin_versions(self) -> dict[str, str]:
        return {s.package: s.version for s in self.all_specs()}


def unknown_name_message(kind: str, name: str, installed: list[str]) -> str:
    k = KINDS[kind]
    close = difflib.get_close_matches(name, installed, n=1)
    hint = f" Did you mean '{close[0]}'?" if close else ""
    package = k.package_hint.format(name=name)
    listing = ", ".join(installed) if installed else "none"
    return (
        f"unknown {kind} '{name}'. Installed: {listing}.{hint} "
        f"If it lives in a plugin package, install it (for example `pip install {package}`)."
    )


def _conf_dir_of(plugin: object) -> Path | None:
    module_file = getattr(plugin, "__file__", None)
    if module_file is None:
        module = sys.modules.get(getattr(plugin, "__module__", ""), None)
        module_file = getattr(module, "__file__", None)
    if module_file is None:
        return None
    conf = Path(module_file).resolve().parent / "conf"
    return conf if conf.is_dir() else None


def load_plugins(pm: pluggy.PluginManager) -> dict[int, tuple[str, str]]:
    """Register every ``rlinf`` entry point; return ``id(plugin) -> (package, version)``.

    Entry points load one by one so that one broken third-party plugin costs a warning,
    not the whole CLI. ``RLINF_BLOCK_PLUGINS=a,b`` blocks entry points by name.
    """
    from importlib import metadata

    for blocked in filter(None, os.environ.get("RLINF_BLOCK_PLUGINS", "").split(",")):
        pm.set_blocked(blocked.strip())
    dists: dict[int, tuple[str, str]] = {}
    for dist in metadata.distributions():
        for ep in dist.entry_points:
            if ep.group != ENTRY_POINT_GROUP or pm.is_blocked(ep.name) or pm.get_plugin(ep.name) is not None:
                continue
            try:
                plugin = ep.load()
            except Exception as exc:
                print(f"warning: rlinf plugin '{ep.name}' ({dist.metadata['Name']}) failed to import: "
                      f"{type(exc).__name__}: {exc}", file=sys.stderr)
                continue
            pm.register(plugin, name=ep.name)
            dists[id(plugin)] = (dist.metadata["Name"], dist.version)
    return dists


@lru_cache(maxsize=1)
def get_registry() -> Registry:
    pm = pluggy.PluginManager("rlinf")
    pm.add_hookspecs(hookspecs)
    try:
        dists = load_plugins(pm)
        pm.check_pending()
        return Registry(pm, dists)
    except (RuntimeError, pluggy.PluginValidationError) as exc:
        raise UserError(f"plugin registry: {exc}") from exc


def reset_registry() -> None:
    """Forget the cached registry (tests install and uninstall plugins)."""
    get_registry.cache_clear()
    importlib.invalidate_caches()
