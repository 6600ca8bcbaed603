"""Which plugins are installed, and their own config options (``conf/<group>/<name>.yaml``)."""

from __future__ import annotations

from typing import Any

from rlinf_cli.errors import UserError
from rlinf_cli.registry import get_registry, unknown_name_message

# the kinds with a contract, in the order `rlinf check-plugin NAME` looks a name up
CONTRACT_KINDS = ("model", "algorithm", "simulator", "accelerator", "executor", "tool")


def installed(kind: str, *, embodied: bool = False) -> list[Any]:
    """Registered specs of ``kind``, by name; ``embodied``: without text-modality ones (their
    contracts are the text-task checks, tests/contracts/test_text_contract.py)."""
    specs = sorted(get_registry().specs(kind).values(), key=lambda s: s.name)
    return [s for s in specs if not (embodied and s.attrs.get("modality") == "text")]


def spec_of(kind: str, name: str) -> Any:
    """The registered spec; an unknown name is the registry's usual one-line error."""
    return get_registry().get(kind, name)


def kinds_of(name: str) -> list[str]:
    """The contract kinds under which ``name`` is registered (a name is unique per kind only)."""
    reg = get_registry()
    return [k for k in CONTRACT_KINDS if name in reg.specs(k)]


def unknown_plugin(name: str) -> UserError:
    """The registry's one-line error for a name no kind registers: for the kind with the closest
    installed name (a typo names its neighbour), models otherwise."""
    import difflib


    reg = get_registry()
    kind = next((k for k in CONTRACT_KINDS if difflib.get_close_matches(name, list(reg.specs(k)), n=1)), "model")
    return UserError(unknown_name_message(kind, name, sorted(reg.specs(kind)), reg.broken))


def option(spec: Any, group: str) -> dict[str, Any]:
    """The plugin's own config option, resolved to plain data; asserts it exists and names the plugin."""
    from omegaconf import OmegaConf

    assert spec.conf_dir is not None, f"{spec.package} ships no conf/ directory beside its hook module"
    path = spec.conf_dir / group / f"{spec.name}.yaml"
    assert path.is_file(), f"{spec.package} ships no {group}/{spec.name}.yaml"
    node = OmegaConf.to_container(OmegaConf.load(path), resolve=True)
    assert isinstance(node, dict) and node.get("name") == spec.name, \
        f"{group}/{spec.name}.yaml must say `name: {spec.name}`"
    return node
