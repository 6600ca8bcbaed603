"""Versioned configuration: the defaults of past releases, what changed since, and renamed keys.

``rlinf_cli/conf_history/<version>.yaml`` stores, for one release of the core, each stage's own
defaults (the shared ``common`` keys included), the option each plugin group takes when the user
picks none, and the defaults of every option of every group that was installed when the snapshot
was taken (``tools/release.py config-history``, run by ``make dist``). The package versions behind
those options are recorded beside them. ``rlinf config show <stage> --diff OLD[..NEW]`` compares
two of them, or one with the installed defaults, for the same group choices.

Renamed keys live in ``renamed.yaml`` beside the configs (the core's ``conf/renamed.yaml``, or a
plugin's ``conf/renamed.yaml`` for keys of its own groups): ``old.dotted.key: new.dotted.key``.
An override that names an old key is refused with one line naming the new key; a checkpoint
written before the rename has its saved keys carried over to the new names.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Iterable

from rlinf_cli.errors import UserError

HISTORY = Path(__file__).resolve().parent / "conf_history"
RENAMED_FILE = "renamed.yaml"
CURRENT = "installed"


# -- renamed keys ------------------------------------------------------------------------------
def renames(dirs: Iterable[Path] | None = None) -> dict[str, str]:
    """``{old key: new key}`` from every ``renamed.yaml`` of the core and the installed plugins."""
    import yaml

    if dirs is None:
        from rlinf_cli.config import search_dirs

        dirs = search_dirs()
    table: dict[str, str] = {}
    for d in dirs:
        path = Path(d) / RENAMED_FILE
        if not path.is_file():
            continue
        data = yaml.safe_load(path.read_text()) or {}
        for old, new in (data.get("renamed") or {}).items():
            table[str(old)] = str(new)
    # a key renamed twice (a -> b, later b -> c) points straight at its newest name
    for old in list(table):
        seen = {old}
        while table[old] in table and table[old] not in seen:
            seen.add(table[old])
            table[old] = table[table[old]]
    return table


def renamed_key_message(key: str, table: dict[str, str] | None = None) -> str | None:
    """One line for an override naming a renamed key (or a key under a renamed section), else None."""
    new_key = translate(key, renames() if table is None else table)
    return f"config key '{key}' was renamed to '{new_key}'; write {new_key}=... instead" if new_key != key else None


def translate(key: str, table: dict[str, str]) -> str:
    """The current name of a key saved under an older name (unchanged if it was not renamed)."""
    for old, new in table.items():
        if key == old or key.startswith(old + "."):
            return new + key[len(old):]
    return key


# -- snapshots -----------------------------------------------------------------------------------
def snapshot() -> dict[str, Any]:
    """The installed defaults: every stage's own keys and default choices, every group option."""
    from omegaconf import OmegaConf

    from rlinf_cli import DISTRIBUTION, __version__
    from rlinf_cli.config import STAGES, compose, group_options, stage_groups
    from rlinf_cli.registry import GROUP_TO_KIND, get_registry

    stages: dict[str, Any] = {}
    groups: dict[str, dict[str, Any]] = {}
    for stage in STAGES:
        cfg = OmegaConf.to_container(compose(stage, recommend=False), resolve=False)
        choices = dict(cfg.pop("choices"))
        cfg.pop("stage", None)
        for group in stage_groups(stage):
            cfg.pop(group, None)
            for option in group_options(group):
                if option not in groups.setdefault(group, {}):
                    node = compose(stage, [f"{group}={option}"], recommend=False)[group]
                    groups[group][option] = OmegaConf.to_container(node, resolve=False)
        stages[stage] = {"choices": choices, "config": cfg}
    reg = get_registry()
    providers = {}
    for group, options in groups.items():
        for option in options:
            spec = reg.specs(GROUP_TO_KIND[group]).get(option)
            providers[f"{group}={option}"] = f"{spec.package} {spec.version}" if spec else f"{DISTRIBUTION} {__version__}"
    return {"version": __version__, "packages": {DISTRIBUTION: __version__, **dict(sorted({s.package: s.version for s in reg.all_specs()}.items()))},
            "options_from": providers, "stages": stages, "groups": groups}


def installed(stage: str, choices: dict[str, str]) -> dict[str, Any]:
    """The installed defaults of one stage with the given group choices, shaped like a snapshot
    (one composition instead of the whole snapshot)."""
    from omegaconf import OmegaConf

    from rlinf_cli import __version__
    from rlinf_cli.config import compose, default_choice

    cfg = OmegaConf.to_container(compose(stage, [f"{g}={c}" for g, c in choices.items()], recommend=False), resolve=False)
    cfg.pop("choices", None)
    cfg.pop("stage", None)
    groups = {g: {c: cfg.pop(g)} for g, c in choices.items()}
    return {"version": __version__, "groups": groups,
            "stages": {stage: {"choices": {g: default_choice(stage, g) for g in choices}, "config": cfg}}}


def write_snapshot(directory: Path | None = None) -> Path:
    """Write the installed defaults as ``<directory>/<core version>.yaml``; returns the path."""
    import yaml

    directory = directory or HISTORY
    snap = snapshot()
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{snap['version']}.yaml"
    header = (f"# Defaults of rlinf-cli {snap['version']} and the plugins installed with it, for\n"
              f"# `rlinf config show <stage> --diff {snap['version']}`. Generated by `make config-history`; do not edit.\n")
    path.write_text(header + yaml.safe_dump(snap, sort_keys=False, width=120))
    return path


def versions(directory: Path | None = None) -> list[str]:
    """Stored versions, oldest first."""
    directory = directory or HISTORY
    return sorted((p.stem for p in directory.glob("*.yaml")), key=_version_key)


def load(version: str, directory: Path | None = None) -> dict[str, Any]:
    import yaml

    directory = directory or HISTORY
    path = directory / f"{version}.yaml"
    if not path.is_file():
        stored = ", ".join(versions(directory)) or "none"
        raise UserError(f"no stored defaults for version '{version}'; stored versions: {stored} "
                        f"(or '{CURRENT}' for this install)")
    try:
        snap = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as exc:
        snap = exc
    if not isinstance(snap, dict) or not isinstance(snap.get("stages"), dict):
        from rlinf_cli import DISTRIBUTION

        raise UserError(f"stored defaults '{path}' are damaged; reinstall {DISTRIBUTION}")
    return snap


# -- diffs ---------------------------------------------------------------------------------------
def view(snap: dict[str, Any], stage: str, choices: dict[str, str]) -> tuple[dict[str, Any], list[str]]:
    """Flat ``{key: value}`` of ``stage`` in ``snap`` with the given group choices, and the choices
    that snapshot did not have (their keys are then absent)."""
    if stage not in snap.get("stages", {}):
        raise UserError(f"version {snap.get('version')} has no stored defaults for `rlinf {stage}`")
    flat = _flatten(snap["stages"][stage]["config"])
    absent = []
    for group, option in choices.items():
        node = snap.get("groups", {}).get(group, {}).get(option)
        if node is None:
            absent.append(f"{group}={option}")
            continue
        flat.update({f"{group}.{k}" if k else group: v for k, v in _flatten(node).items()})
    return flat, absent


def diff(old: dict[str, Any], new: dict[str, Any], table: dict[str, str] | None = None) -> list[tuple[str, str, Any, Any]]:
    """``(change, key, old value, new value)`` rows: changed, added, removed and renamed keys."""
    table = {} if table is None else table
    rows: list[tuple[str, str, Any, Any]] = []
    renamed_to = {}
    for key in old:
        if key not in new:
            target = translate(key, table)
            if target != key and target in new and target not in old:
                renamed_to[target] = key
    for key in sorted(set(old) | set(new)):
        if key in renamed_to:
            src = renamed_to[key]
            rows.append(("renamed", f"{src} -> {key}", old[src], new[key]))
        elif key in renamed_to.values():
            continue
        elif key not in old:
            rows.append(("added", key, None, new[key]))
        elif key not in new:
            rows.append(("removed", key, old[key], None))
        elif old[key] != new[key]:
            rows.append(("changed", key, old[key], new[key]))
    return rows


def parse_range(spec: str) -> tuple[str, str]:
    """``OLD`` (against the installed defaults) or ``OLD..NEW``."""
    old, sep, new = spec.partition("..")
    old, new = old.strip(), (new.strip() if sep else CURRENT)
    if not old or not new:
        raise UserError(f"bad --diff '{spec}': write a version (--diff 0.1.0) or two (--diff 0.1.0..0.2.0)")
    return old, new


def report(stage: str, spec: str, overrides: list[str]) -> str:
    """What changed in ``stage``'s defaults between two versions, for the user's group choices."""
    from rlinf_cli import __version__
    from rlinf_cli.config import compose, default_choice, stage_groups
    from rlinf_cli.registry import GROUP_TO_KIND

    old_v, new_v = parse_range(spec)
    current = compose(stage, overrides)  # bad or renamed keys are refused here, as in a run
    picked = {g: c for g, c in current.choices.items() if any(o.split("=")[0].lstrip("+") == g for o in overrides)}
    snaps = {v: load(v) for v in {old_v, new_v} if v != CURRENT}
    new_defaults = (snaps[new_v]["stages"].get(stage, {}).get("choices", {}) if new_v in snaps
                    else {g: default_choice(stage, g) for g in stage_groups(stage)})
    choices = {g: picked.get(g) or new_defaults.get(g) or current.choices[g] for g in stage_groups(stage)}
    if CURRENT in (old_v, new_v):
        snaps[CURRENT] = installed(stage, choices)
    label = {v: (f"{__version__} ({CURRENT})" if v == CURRENT else v) for v in (old_v, new_v)}
    old_flat, old_absent = view(snaps[old_v], stage, choices)
    new_flat, new_absent = view(snaps[new_v], stage, choices)
    lines = [f"rlinf {stage} defaults, {label[old_v]} -> {label[new_v]}, with "
             + " ".join(f"{g}={c}" for g, c in choices.items())]
    old_defaults = snaps[old_v]["stages"].get(stage, {}).get("choices", {})
    for group in choices:
        if group in old_defaults and group in new_defaults and old_defaults[group] != new_defaults[group]:
            lines.append(f"  default  {group}: {old_defaults[group]} -> {new_defaults[group]} "
                         f"(the {GROUP_TO_KIND[group]} used when none is picked)")
    for option in old_absent:
        lines.append(f"  note     {option} was not installed in {label[old_v]}: its keys count as added")
    for option in new_absent:
        lines.append(f"  note     {option} was not installed in {label[new_v]}: its keys count as removed")
    rows = diff(old_flat, new_flat, renames())
    for change, key, a, b in rows:
        if change == "changed":
            lines.append(f"  changed  {key}: {_show(a)} -> {_show(b)}")
        elif change == "added":
            lines.append(f"  added    {key}: {_show(b)}")
        elif change == "removed":
            lines.append(f"  removed  {key} (was {_show(a)})")
        else:
            lines.append(f"  renamed  {key}" + (f": {_show(a)} -> {_show(b)}" if a != b else ""))
    lines.append(f"{len(rows)} difference(s)" if rows else "no differences")
    return "\n".join(lines)


def _show(value: Any) -> str:
    import json

    return json.dumps(value) if not isinstance(value, str) else value


def _flatten(node: Any, prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    if isinstance(node, dict) and node:
        for k, v in node.items():
            out.update(_flatten(v, f"{prefix}{k}."))
    else:
        out[prefix[:-1]] = node
    return out


def _version_key(version: str) -> tuple:
    return tuple((0, int(p), "") if p.isdigit() else (1, 0, p) for p in re.split(r"[.+-]", version))
