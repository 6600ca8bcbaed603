"""Plugin discovery through the ``rlinf`` entry-point group.

Bundled plugins register exactly like third-party ones: the core never names them.
"""

from __future__ import annotations

import difflib
import importlib
import os
import re
import sys
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any, Callable

import pluggy

from rlinf_cli import hookspecs
from rlinf_cli.errors import UserError, shown
from rlinf_cli.hookspecs import API_VERSION
from rlinf_cli.settings import plain

ENTRY_POINT_GROUP = "rlinf"
# The extra a simulator plugin lists the other plugins under that `rlinf rl` / `sft` need with it
# (a model, an algorithm, an executor): `pip install 'rlinf-sim-x[train]'`. Read from the installed
# metadata to say what to install, so the core never names a plugin itself.
TRAIN_EXTRA = "train"
# The stages a component can be the default for (`register(..., default=("rl",))`)
STAGES = ("collect", "sft", "rl", "eval", "serve")  # serve: `rlinf env serve`
# The module-level name in a plugin's hook module that declares the plugin API it was built for
API_ATTR = "RLINF_API"


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
        # tools are not a stage's group choice: a text task names them in `sim.tools`; their options
        # (conf/tool/<name>.yaml) are overridden under `sim.tool_options.<name>`
        Kind("tool", "register_tools", "tool", "rlinf-tool-{name}"),
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
    # the stages this component is the default for when the user picks none (every stage: STAGES)
    default: tuple[str, ...] = ()
    package: str = "?"
    version: str = "?"
    conf_dir: Path | None = None
    attrs: dict[str, Any] = field(default_factory=dict)
    problem: str | None = None  # why it cannot be used (a plugin built for another API major)
    warning: str | None = None  # said once, on first use (no API version declared, a newer minor)

    def default_for(self, stage: str) -> bool:
        return stage in self.default

    def load(self) -> Any:
        """Import and return the factory object."""
        if self.problem is not None:  # also refused here: a caller may hold the spec from a listing
            raise UserError(f"{self.kind} '{self.name}' cannot be used: {self.problem}")
        if self.warning is not None:
            _warn_once(self.warning)
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


@dataclass(frozen=True)
class BrokenPlugin:
    """An installed ``rlinf`` entry point whose module failed to import."""

    entry_point: str
    package: str
    version: str
    error: str  # "ModuleNotFoundError: No module named 'foo'"


def _parse_api(value: Any) -> tuple[int, int] | None:
    """``"1.0"`` (or ``"1"``) as ``(1, 0)``; None when it is not ``MAJOR[.MINOR]``."""
    m = re.fullmatch(r"\s*(\d+)(?:\.(\d+))?\s*", str(value)) if isinstance(value, (str, int)) else None
    return (int(m.group(1)), int(m.group(2) or 0)) if m else None


def api_problem(declared: Any, package: str, version: str) -> tuple[str | None, str | None]:
    """Judge a plugin's declared API version against :data:`API_VERSION`: ``(problem, warning)``.

    Another MAJOR (or a malformed value) is a problem: the plugin's components cannot be used.
    A newer MINOR works but may ask for names this core lacks; no declaration is taken as
    compatible for now (plugins written before API versions existed): both are warnings."""
    core = _parse_api(API_VERSION)
    assert core is not None
    who = f"plugin package {package} {version}"
    if declared is None:
        return None, (f"{who} declares no plugin API version (set {API_ATTR} = \"{API_VERSION}\" in its hook "
                      f"module); taken as built for API {core[0]}.x")
    mine = _parse_api(declared)
    if mine is None:
        return (f"{who} declares {API_ATTR} = {declared!r}, not \"MAJOR.MINOR\"; this rlinf-cli speaks plugin API "
                f"{API_VERSION}: fix the plugin's declaration or reinstall it (`pip install -U {package}`)"), None
    if mine[0] > core[0]:
        return (f"{who} was built for plugin API {declared}; this rlinf-cli speaks API {API_VERSION}: upgrade "
                f"rlinf-cli (`pip install -U rlinf-cli`) or install a release of {package} built for API {core[0]}.x"), None
    if mine[0] < core[0]:
        return (f"{who} was built for plugin API {declared}; this rlinf-cli speaks API {API_VERSION}: upgrade the "
                f"plugin (`pip install -U {package}`) to a release built for API {core[0]}.x, or use a rlinf-cli "
                f"that speaks API {mine[0]}.x"), None
    if mine[1] > core[1]:
        return None, (f"{who} was built for plugin API {declared}, newer than this rlinf-cli's {API_VERSION}: it may "
                      f"use parts this core lacks; upgrade rlinf-cli (`pip install -U rlinf-cli`)")
    return None, None


_warned: set[str] = set()


def _warn_once(message: str) -> None:
    """One ``warning:`` line on stderr, once a process."""
    if message not in _warned:
        _warned.add(message)
        print(f"warning: {message}", file=sys.stderr)


def _parse_default(default: Any, kind: str, name: str, package: str) -> tuple[str, ...]:
    """``register(default=...)``: True (every stage), False (none) or the stage names."""
    if default is True:
        return STAGES
    if default is False or default is None:
        return ()
    stages = (default,) if isinstance(default, str) else default
    if not isinstance(stages, (tuple, list)) or not all(isinstance(s, str) for s in stages):
        raise RuntimeError(f"{kind} '{name}' from {package}: default must be True, False or a tuple of stage "
                           f"names, got {default!r}")
    unknown = [s for s in stages if s not in STAGES]
    if unknown:
        raise RuntimeError(f"{kind} '{name}' from {package}: default names unknown stage(s) {', '.join(unknown)}; "
                           f"stages: {', '.join(STAGES)}")
    return tuple(stages)


class Registry:
    def __init__(self, pm: pluggy.PluginManager, dists: dict[int, tuple[str, str]] | None = None,
                 broken: list[BrokenPlugin] | None = None):
        self.pm = pm
        self._dists = dists or {}
        self._specs: dict[str, dict[str, Spec]] = {k: {} for k in KINDS}
        self.broken = list(broken or [])
        self.incompatible: dict[str, str] = {}  # package -> the one line saying why it cannot be used
        self.api_notes: dict[str, str] = {}  # package -> a warning about its declared API (said on use)
        self._collect()

    def _collect(self) -> None:
        for kind in KINDS.values():
            for impl in getattr(self.pm.hook, kind.hook).get_hookimpls():
                package, version = self._dists.get(id(impl.plugin), (self.pm.get_name(impl.plugin), "?"))
                # judged here, said where it matters: a warning when a component is used (not on
                # every command: an error stays one line), the listing names both
                problem, warning = api_problem(getattr(impl.plugin, API_ATTR, None), package, version)
                if warning:
                    self.api_notes[package] = warning
                if problem:
                    self.incompatible[package] = problem
                conf_dir = _conf_dir_of(impl.plugin)
                register = self._registrar(kind.name, package, version, conf_dir, problem, warning)
                if problem is None:
                    impl.function(register=register)
                    continue
                try:  # its names, so that asking for one says why it cannot be used
                    impl.function(register=register)
                except Exception:  # a hook of another API may not even run: the listing names the package
                    pass

    def _registrar(self, kind: str, package: str, version: str, conf_dir: Path | None,
                   problem: str | None = None, warning: str | None = None) -> Callable:
        def register(name: str, factory: str, *, summary: str = "", default: bool | tuple[str, ...] = False,
                     **attrs: Any) -> None:
            existing = self._specs[kind].get(name)
            if existing is not None:
                raise RuntimeError(
                    f"duplicate {kind} name '{name}': registered by {existing.package} and by {package}; "
                    f"uninstall one of them"
                )
            if ":" not in factory:
                raise RuntimeError(f"{kind} '{name}' from {package}: factory must be 'module:attr', got {factory!r}")
            stages = _parse_default(default, kind, name, package)
            self._specs[kind][name] = Spec(kind, name, factory, summary, stages, package, version, conf_dir, attrs,
                                           problem, warning)

        return register

    # -- queries ---------------------------------------------------------------------------
    def specs(self, kind: str) -> dict[str, Spec]:
        return dict(self._specs[kind])

    def all_specs(self) -> list[Spec]:
        return [s for kind in KINDS for s in self._specs[kind].values()]

    def get(self, kind: str, name: str) -> Spec:
        spec = self._specs[kind].get(name)
        if spec is None:
            raise UserError(unknown_name_message(kind, name, sorted(self._specs[kind]), self.broken))
        if spec.problem is not None:
            raise UserError(f"{kind} '{name}' cannot be used: {spec.problem}")
        return spec

    def load(self, kind: str, name: str) -> Any:
        return self.get(kind, name).load()

    def default(self, kind: str, stage: str) -> str | None:
        """The usable component registered as ``stage``'s default (the first by name if several)."""
        defaults = [s.name for s in self._specs[kind].values() if s.default_for(stage) and s.problem is None]
        return sorted(defaults)[0] if defaults else None

    def missing_message(self, kind: str, simulator: str | None = None) -> str:
        """What to say when no installed plugin provides a ``kind`` (and none was chosen): the
        package for it that the chosen simulator's ``train`` extra lists, else the naming convention."""
        k = KINDS[kind]
        head = f"no {kind} installed for '{k.group}'"
        sim = self._specs["simulator"].get(simulator) if simulator else None
        if sim is not None:
            prefix = _normalize(k.package_hint.format(name="")).rstrip("-")  # rlinf-model, rlinf-algo, ...
            listed = extra_requirements(sim.package)
            providers = [p for p in listed if _normalize(p).startswith(prefix)]
            if providers:
                return (f"{head}: install one with `pip install {' '.join(providers)}` (listed by {sim.package}'s "
                        f"'{TRAIN_EXTRA}' extra; `pip install '{sim.package}[{TRAIN_EXTRA}]'` installs all of "
                        f"{', '.join(listed)})")
        return (f"{head}; install a plugin package that provides one (named {k.package_hint.format(name='<name>')} "
                f"by convention; `rlinf plugins list` shows what is installed)")

    def conf_dirs(self) -> list[Path]:
        dirs: list[Path] = []
        for spec in self.all_specs():
            if spec.conf_dir is not None and spec.conf_dir not in dirs:
                dirs.append(spec.conf_dir)
        return dirs



def unknown_name_message(kind: str, name: str, installed: list[str], broken: list[BrokenPlugin] = ()) -> str:
    """What to say when ``name`` is not registered: the names that are, a near match, and either
    the installed plugin package that failed to import (likely the one meant) or what to install."""
    k = KINDS[kind]
    listing = ", ".join(installed) if installed else "none"
    if _looks_like_path(name):  # a file of settings given where an option's name goes: no package has that name
        return (f"{k.group}= takes the name of a {kind}, not a file: {shown(name)} looks like a path. Installed "
                f"{kind}s: {listing}. Pick one and set its keys with overrides ({k.group}.KEY=VALUE)")
    close = difflib.get_close_matches(name, installed, n=1)
    hint = f" Did you mean '{close[0]}'?" if close else ""
    package = k.package_hint.format(name=name)
    suspects = [b for b in broken if name.lower() in (b.package + " " + b.entry_point).lower().replace("_", "-")
                or name.lower() in (b.package + " " + b.entry_point).lower()] or list(broken)
    if suspects:
        b = suspects[0]
        return (f"{kind} '{name}' is not available: plugin package {b.package} {b.version} is installed but broken, "
                f"its entry point '{b.entry_point}' failed to import ({b.error}). Fix that import (a missing "
                f"dependency?) or reinstall it with `pip install -U {b.package}`. Working {kind}s: {listing}.")
    if not _PACKAGE_NAME.match(package):
        return f"unknown {kind} {shown(name)}. Installed: {listing}.{hint}"
    return (
        f"unknown {kind} '{name}'. Installed: {listing}.{hint} "
        f"If it lives in a plugin package, install it (for example `pip install {package}`)."
    )


def extra_requirements(package: str, extra: str = TRAIN_EXTRA) -> list[str]:
    """The distributions that ``package``'s ``extra`` pulls in, from its installed metadata
    (``Requires-Dist: name...; extra == "train"``); none if it is not installed or has no such extra."""
    from importlib import metadata

    try:
        requires = metadata.requires(package) or []
    except metadata.PackageNotFoundError:
        return []
    names = []
    for req in requires:
        spec, _, marker = req.partition(";")
        name = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)", spec)
        if name and re.search(rf"""\bextra\s*==\s*["']{re.escape(extra)}["']""", marker):
            names.append(name.group(1))
    return list(dict.fromkeys(names))


def _normalize(name: str) -> str:
    """A distribution name as the index compares it (PEP 503)."""
    return re.sub(r"[-_.]+", "-", name).lower()


# what pip takes as a distribution name (PEP 508), and how long a name can sensibly be
_PACKAGE_NAME = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9._-]{0,98}[A-Za-z0-9])?$")


def _looks_like_path(name: str) -> bool:
    return "/" in name or "\\" in name or name.startswith((".", "~")) or \
        name.lower().endswith((".yaml", ".yml", ".json", ".toml", ".py"))


def _conf_dir_of(plugin: object) -> Path | None:
    module_file = getattr(plugin, "__file__", None)
    if module_file is None:
        module = sys.modules.get(getattr(plugin, "__module__", ""), None)
        module_file = getattr(module, "__file__", None)
    if module_file is None:
        return None
    conf = Path(module_file).resolve().parent / "conf"
    return conf if conf.is_dir() else None


def load_plugins(pm: pluggy.PluginManager) -> tuple[dict[int, tuple[str, str]], list[BrokenPlugin]]:
    """Register every ``rlinf`` entry point; return ``id(plugin) -> (package, version)`` and the
    entry points that failed to import.

    Entry points load one by one so that one broken third-party plugin costs a warning,
    not the whole CLI. ``RLINF_BLOCK_PLUGINS=a,b`` blocks entry points by name.
    """
    from importlib import metadata

    for blocked in filter(None, os.environ.get("RLINF_BLOCK_PLUGINS", "").split(",")):
        pm.set_blocked(blocked.strip())
    dists: dict[int, tuple[str, str]] = {}
    broken: list[BrokenPlugin] = []
    for dist in metadata.distributions():
        for ep in dist.entry_points:
            if ep.group != ENTRY_POINT_GROUP or pm.is_blocked(ep.name) or pm.get_plugin(ep.name) is not None:
                continue
            try:
                plugin = ep.load()
            except Exception as exc:
                error = f"{type(exc).__name__}: {' '.join(str(exc).split())}"
                broken.append(BrokenPlugin(ep.name, dist.metadata["Name"], dist.version, error))
                print(f"warning: rlinf plugin '{ep.name}' ({dist.metadata['Name']}) failed to import: {error}",
                      file=sys.stderr)
                continue
            pm.register(plugin, name=ep.name)
            dists[id(plugin)] = (dist.metadata["Name"], dist.version)
    return dists, broken


@lru_cache(maxsize=1)
def get_registry() -> Registry:
    pm = pluggy.PluginManager("rlinf")
    pm.add_hookspecs(hookspecs)
    try:
        dists, broken = load_plugins(pm)
        pm.check_pending()
        return Registry(pm, dists, broken)
    except (RuntimeError, pluggy.PluginValidationError) as exc:
        raise UserError(f"plugin registry: {exc}") from exc


def make_simulator(node: Any) -> Any:
    """Build the simulator a ``sim`` config node names (torch-free: the env server uses it too)."""
    data = dict(plain(node))
    return get_registry().load("simulator", data["name"])(data)

