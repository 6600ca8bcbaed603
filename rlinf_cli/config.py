"""Configuration through Hydra's compose API.

Each stage has a primary config in ``rlinf_cli/conf/<stage>.yaml``. Plugin groups (``sim``,
``model``, ``algo``, ``accelerator``, ``executor``) are filled from the options that installed
plugins ship under their own ``conf/<group>/`` directory. Overrides are ``key=value`` words.
Bad overrides are caught here with one clear line; Hydra's own messages are a fallback.
"""

from __future__ import annotations

import difflib
import json
import re
from pathlib import Path
from typing import Any, Iterable

from rlinf_cli.errors import UserError, one_line, shown
from rlinf_cli.recommend import lookup, override_text
from rlinf_cli.registry import GROUP_TO_KIND, STAGES, get_registry, unknown_name_message

CORE_CONF = Path(__file__).resolve().parent / "conf"
_MISSING = object()


def search_dirs() -> list[Path]:
    return [CORE_CONF, *get_registry().conf_dirs()]


def group_options(group: str) -> list[str]:
    """Config options available for a group, from the core and every installed plugin."""
    names: set[str] = set()
    for d in search_dirs():
        names.update(p.stem for p in (d / group).glob("*.yaml"))
    return sorted(names)


def stage_groups(stage: str) -> list[str]:
    """Plugin groups the stage's primary config asks for (``- group: ???`` entries)."""
    from omegaconf import OmegaConf

    primary = OmegaConf.load(CORE_CONF / f"{stage}.yaml")
    groups = []
    for entry in primary.get("defaults", []):
        if isinstance(entry, (dict,)) or OmegaConf.is_dict(entry):
            groups.extend(k for k in entry if k in GROUP_TO_KIND)
    return groups


def default_choice(stage: str, group: str) -> str | None:
    """The option used when the user picks none: the registered default for this stage."""
    reg = get_registry()
    kind = GROUP_TO_KIND[group]
    for spec in sorted(reg.specs(kind).values(), key=lambda s: s.name):
        if spec.default_for(stage) and spec.problem is None:
            if spec.name in group_options(group):
                return spec.name
    core = group_options(group)
    return "auto" if "auto" in core else None


def compose(stage: str, overrides: Iterable[str] = (), inherited: Iterable[str] = (), recommend: bool = True) -> Any:
    """Compose the config for ``stage``.

    ``inherited`` overrides (for example the simulator a checkpoint was trained on) apply first;
    the user's ``overrides`` win over them. Where the simulator plugin recommends settings for the
    task and algorithm (``rlinf_cli/recommend.py``) they fill every key neither sets, unless
    ``recommend`` is false (the plain defaults, as release snapshots record them). Returns a
    DictConfig with ``stage`` and ``choices`` (and ``recommended`` where recommendations applied).
    """
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    if stage not in STAGES:
        raise UserError(f"unknown stage '{stage}'; choose one of {', '.join(STAGES)}")
    user = list(overrides)
    parser = OverridesParser.create()
    try:
        parsed = parser.parse_overrides(list(inherited) + user)
    except HydraException as exc:
        raise UserError(f"bad override: {one_line(str(exc).splitlines()[0])}. Write overrides as key=value") from exc

    groups = stage_groups(stage)
    choices: dict[str, str] = {}
    for ov in parsed:
        key = ov.key_or_group
        if key in GROUP_TO_KIND:
            if key not in groups:
                raise UserError(f"'{key}' is not used by `rlinf {stage}`; its groups are {', '.join(groups) or 'none'}")
            choices[key] = str(ov.value())
    for group in groups:
        if group not in choices:
            choice = default_choice(stage, group)
            if choice is None:
                raise UserError(get_registry().missing_message(GROUP_TO_KIND[group], choices.get("sim")))
            choices[group] = choice
        elif choices[group] not in group_options(group):
            kind = GROUP_TO_KIND[group]
            raise UserError(unknown_name_message(kind, choices[group], group_options(group), get_registry().broken))

    searchpath = "hydra.searchpath=[" + ",".join(f"file://{d}" for d in search_dirs()[1:]) + "]"
    group_ovs = [f"{g}={c}" for g, c in choices.items()]
    value_ovs = [ov for ov in parsed if ov.key_or_group not in GROUP_TO_KIND]

    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(CORE_CONF), version_base="1.3"):
            # Value overrides never change the defaults list, so the config composed from the
            # group choices alone is checked against and then updated in place, as Hydra's own
            # compose would (its override step): one composition, not two (~0.3-0.6 s a command).
            cfg = hydra_compose(stage, overrides=[searchpath, *group_ovs])
            fixed = [_checked(cfg, ov) for ov in value_ovs]
            _apply_values(cfg, parser.parse_overrides(fixed) if fixed else [])
    except (HydraException, OmegaConfBaseException) as exc:
        raise UserError(f"config error: {one_line(str(exc).splitlines()[0])}") from exc
    finally:
        GlobalHydra.instance().clear()

    OmegaConf.set_struct(cfg, False)
    cfg.stage = stage
    cfg.choices = choices
    if recommend:
        _apply_recommendations(cfg, {ov.key_or_group for ov in value_ovs}, parser)
    try:
        OmegaConf.resolve(cfg)
    except OmegaConfBaseException as exc:
        raise UserError(f"config error: {one_line(str(exc).splitlines()[0])}") from exc
    _check_plugin_names(cfg, choices)
    return cfg


def _apply_recommendations(cfg: Any, set_keys: set[str], parser: Any) -> None:
    """Fill the keys that neither the user nor a checkpoint set with the simulator's
    recommendation for this task and algorithm; record which keys it filled."""
    from hydra.errors import HydraException
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    values, label = lookup(cfg, search_dirs()[1:])
    taken = {k.lstrip("+~") for k in set_keys}

    def is_set(key: str) -> bool:
        return any(key == k or key.startswith(k + ".") or k.startswith(key + ".") for k in taken)

    applied = [k for k in values if not is_set(k) and OmegaConf.select(cfg, k, default=_MISSING) is not _MISSING]
    if not applied:
        return
    try:
        parsed = parser.parse_overrides([override_text(k, values[k]) for k in applied])
        _apply_values(cfg, parser.parse_overrides([_checked(cfg, ov) for ov in parsed]))
    except (UserError, HydraException, OmegaConfBaseException) as exc:
        raise UserError(f"the simulator plugin's recommended settings for {label} are broken ({one_line(str(exc))}); "
                        f"set the key yourself, or report it to the plugin's authors") from exc
    cfg.recommended = {"for": label, "keys": applied}


def _apply_values(cfg: Any, overrides: list[Any]) -> None:
    """Apply parsed ``key=value`` / ``+key=value`` / ``++key=value`` / ``~key`` overrides to a
    composed config with Hydra's own rules (its ConfigLoaderImpl step after composition)."""
    if not overrides:
        return
    from hydra._internal.config_loader_impl import ConfigLoaderImpl

    ConfigLoaderImpl._apply_overrides_to_config(overrides, cfg)


def _checked(base: Any, ov: Any) -> str:
    """Validate one ``key=value`` override against the composed base; return it (maybe fixed)."""
    from omegaconf import OmegaConf

    text = ov.input_line
    if ov.is_add() or ov.is_force_add() or ov.is_delete():
        return text
    key = ov.key_or_group
    from omegaconf.errors import MissingMandatoryValue

    try:
        old = OmegaConf.select(base, key, default=_MISSING, throw_on_missing=True)
    except MissingMandatoryValue:  # a mandatory `???` key: it exists, any value will do
        old = None
    if old is _MISSING:
        renamed = renamed_key_message(key)
        if renamed:
            raise UserError(renamed)
        keys = _flat_keys(OmegaConf.to_container(base, resolve=False))
        close = difflib.get_close_matches(key, keys, n=1, cutoff=0.5)
        hint = f" Did you mean '{close[0]}'?" if close else " See `rlinf config show` for the keys."
        add = f"+{key}=..." if len(key) <= 80 else "+KEY=..."
        raise UserError(f"unknown config key {shown(key)}.{hint} (To add a new key on purpose, write {add})")
    new = ov.value()
    if old is None or new is None or OmegaConf.is_config(old) and not isinstance(new, (dict, list)):
        return text
    if OmegaConf.is_config(old):
        old = OmegaConf.to_container(old, resolve=False)
    if isinstance(old, int) and not isinstance(old, bool) and isinstance(new, float):
        if new.is_integer():
            return f"{key}={int(new)}"
        if key.endswith("_s"):  # seconds: a default written as a whole number (flush_s: 5) takes 0.5 as well
            return text
    for kind, expected, accepts in _TYPES:
        if isinstance(old, kind):
            if not isinstance(new, accepts) or isinstance(new, bool) and kind is not bool:
                raise UserError(f"bad value for '{key}': expected {expected}, got {shown(new)} (default is {shown(old)})")
            break
    return text


# the type of a default -> what the user is told to write, and the values that may replace it
# (bool first: it is an int; a bool never replaces a number)
_TYPES = ((bool, "true or false", bool), (int, "an integer", int), (float, "a number", (int, float)),
          (list, "a list like [a,b]", list), (dict, "a mapping like {a:1}", dict))


def _flat_keys(node: Any, prefix: str = "") -> list[str]:
    keys: list[str] = []
    if isinstance(node, dict):
        for k, v in node.items():
            full = f"{prefix}{k}"
            keys.append(full)
            keys.extend(_flat_keys(v, full + "."))
    return keys


def _check_plugin_names(cfg: Any, choices: dict[str, str]) -> None:
    reg = get_registry()
    for group in choices:
        node = cfg.get(group)
        name = node.get("name") if node is not None else None
        if name is None:
            raise UserError(f"config option '{group}={choices[group]}' has no 'name' key naming its plugin")
        if name != "auto":
            reg.get(GROUP_TO_KIND[group], name)


def flatten(cfg: Any) -> dict[str, Any]:
    """``{"algo.lr": 0.0003, ...}`` for tracking params."""
    from omegaconf import OmegaConf

    container = OmegaConf.to_container(cfg, resolve=True) if OmegaConf.is_config(cfg) else cfg
    out: dict[str, Any] = {}

    def walk(node: Any, prefix: str) -> None:
        if isinstance(node, dict):
            for k, v in node.items():
                walk(v, f"{prefix}{k}.")
        else:
            out[prefix[:-1]] = node

    walk(container, "")
    return out


def to_yaml(cfg: Any) -> str:
    from omegaconf import OmegaConf

    return OmegaConf.to_yaml(cfg)


def node_overrides(prefix: str, node: Any) -> list[str]:
    """Force-overrides (``++sim.env_id=...``) that reproduce a saved value or node.

    The ``name`` of a plugin group node is skipped: the group choice carries it.
    """
    items = flatten(node) if isinstance(node, dict) else {"": node}
    out = []
    for key, value in items.items():
        if key == "name" and prefix in GROUP_TO_KIND:
            continue
        full = f"{prefix}.{key}" if key else prefix
        out.append(f"++{full}={override_value(value)}")
    return out


_HYDRA_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_\-]*")


def override_value(value: Any) -> str:
    """``value`` spelled so that Hydra's override parser gives it back unchanged.

    Strings are single-quoted with Hydra's own escapes (a quote, backslashes before a quote or the
    end): JSON's ``\\n`` or ``\\\\`` would reach the config
    as two characters, and a saved ``{question}\\n`` template or ``\\boxed{}`` instruction would
    change each time a checkpoint hands it on. Floats keep Python's spelling (inf, nan); null,
    booleans and integers are JSON's."""
    if isinstance(value, str):
        body = re.sub(r"(\\+)(?='|$)", lambda m: m.group(1) * 2, value)
        return "'" + body.replace("'", "\\'") + "'"
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(override_value(v) for v in value) + "]"
    if isinstance(value, dict):
        keys = [str(k) if _HYDRA_KEY.fullmatch(str(k)) else override_value(str(k)) for k in value]
        return "{" + ", ".join(f"{k}: {override_value(v)}" for k, v in zip(keys, value.values())) + "}"
    return json.dumps(value)


def _user_values(overrides: Iterable[str]) -> dict[str, str]:
    out = {}
    for ov in overrides:
        key, sep, value = ov.partition("=")
        if sep and not key.startswith(("+", "~")):
            out[key.strip()] = value.strip().strip("'\"")
    return out


def inherited_overrides(stage: str, overrides: Iterable[str]) -> list[str]:
    """Overrides taken from the checkpoint a stage starts from, so users need not repeat them.

    ``eval checkpoint=X``, ``collect policy=X`` and ``rl init=X`` reuse X's simulator (and, for
    ``rl``, its model) unless the user picks one; ``rl resume=X`` reuses X's whole config.
    The user's own overrides always win.
    """
    from omegaconf import OmegaConf

    user = _user_values(overrides)
    source_key = {"eval": "checkpoint", "collect": "policy", "rl": "resume" if "resume" in user else "init"}.get(stage)
    source = user.get(source_key or "")
    if not source or source in ("random", "expert", "null") or not (Path(source) / "rlinf.yaml").is_file():
        return []
    try:
        saved = OmegaConf.to_container(OmegaConf.load(Path(source) / "rlinf.yaml"), resolve=True)
    except Exception as exc:
        raise UserError(f"'{Path(source) / 'rlinf.yaml'}' is not valid YAML ({exc}); the checkpoint is damaged") from exc
    if not isinstance(saved, dict):
        return []
    if source_key == "resume" and saved.get("stage") != "rl":
        raise UserError(f"'{source}' cannot be resumed: it was written by `rlinf {saved.get('stage', '?')}`; "
                        f"start an rl run from it with init={source}")
    choices = saved.get("choices") or {}
    groups = stage_groups(stage)
    inherit_groups = ["sim"] if stage in ("eval", "collect") else ["sim", "model"]
    if source_key == "resume":
        inherit_groups = groups
    out: list[str] = []
    for group in inherit_groups:
        if group not in groups or group in user or not isinstance(saved.get(group), dict):
            continue
        choice = choices.get(group) or saved[group].get("name")
        if choice not in group_options(group):
            continue
        out.append(f"{group}={choice}")
        out.extend(node_overrides(group, saved[group]))
    if source_key == "resume":
        skip = {"stage", "choices", "resume", "recommended", *GROUP_TO_KIND}
        for key, value in saved.items():
            if key not in skip:
                out.extend(node_overrides(key, value))
    return _renamed_saved_keys(out)


def _renamed_saved_keys(overrides: list[str]) -> list[str]:
    """A checkpoint saved before a key was renamed: carry its values over to the new key names."""
    table = renames()
    if not table:
        return overrides
    out = []
    for ov in overrides:
        key, sep, value = ov.partition("=")
        plus = key[: len(key) - len(key.lstrip("+"))]
        out.append(f"{plus}{translate(key.lstrip('+'), table)}{sep}{value}" if sep else ov)
    return out


def origins(cfg: Any, overrides: Iterable[str], inherited: Iterable[str]) -> dict[str, str]:
    """Where each value that is not a plain default came from: ``{"algo.lr": "set", ...}`` with
    ``set`` (the user's override), ``checkpoint`` (inherited from init=/resume=) or ``task`` (the
    simulator's recommendation, ``cfg.recommended``)."""
    out: dict[str, str] = {}
    for key in (cfg.get("recommended") or {}).get("keys", []):
        out[str(key)] = "task"
    for source, words in (("checkpoint", inherited), ("set", overrides)):
        for key in _user_values(words):
            out[key.lstrip("+")] = source
        for word in words:  # a group choice (sim=metaworld) is set too
            key = word.partition("=")[0].lstrip("+")
            if key in GROUP_TO_KIND:
                out[f"choices.{key}"] = source
    return out


def annotated_yaml(cfg: Any, marks: dict[str, str]) -> str:
    """The composed config as YAML, each value that is not a plain default marked at the end of
    its line: ``# set`` (your override), ``# checkpoint``, ``# task`` (recommended for the task)."""
    text = to_yaml(cfg)
    label = {"set": "# set", "checkpoint": "# from the checkpoint", "task": "# task recommendation"}
    lines, stack = [], []  # stack: (indent, key) of the mapping keys above the current line
    for line in text.splitlines():
        stripped = line.lstrip(" ")
        indent = len(line) - len(stripped)
        if stripped.startswith("- ") or ":" not in stripped:
            lines.append(line)  # a list item: its key's line carries the mark
            continue
        while stack and stack[-1][0] >= indent:
            stack.pop()
        key = stripped.split(":", 1)[0].strip("'\"")
        stack.append((indent, key))
        mark = marks.get(".".join(k for _, k in stack))
        lines.append(f"{line}  {label[mark]}" if mark in label else line)
    header = ["# Values marked '# set' are your overrides, '# from the checkpoint' come from init=/resume=,",
              "# '# task recommendation' from the simulator plugin's settings for this task and algorithm",
              "# (listed under 'recommended' at the end); unmarked values are the defaults."]
    return "\n".join([*header, *lines]) + "\n"


RENAMED_FILE = "renamed.yaml"


# -- renamed keys ------------------------------------------------------------------------------
def renames(dirs: Iterable[Path] | None = None) -> dict[str, str]:
    """``{old key: new key}`` from every ``renamed.yaml`` of the core and the installed plugins."""
    import yaml

    if dirs is None:
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
