"""Build frozen config dataclasses from config nodes, with one-line errors."""

from __future__ import annotations

import dataclasses
import difflib
import types
import typing
from typing import Any, Mapping, TypeVar

from rlinf_cli.errors import UserError, shown

T = TypeVar("T")


def build(cls: type[T], node: Mapping[str, Any] | None, where: str) -> T:
    """``cls(**node)`` for a dataclass, checking keys and value types.

    ``where`` is the config prefix used in messages (``algo``, ``model``). The key ``name``
    (which plugin) is skipped. ``ValueError`` from ``__post_init__`` becomes a :class:`UserError`.
    A field whose type is itself a dataclass (``lora: LoraSettings``) is built the same way from
    its sub-node (``model.lora.r=8``), with its own checks and messages naming the whole key.
    """
    from omegaconf import OmegaConf

    if node is None:
        data: dict[str, Any] = {}
    elif OmegaConf.is_config(node):
        data = OmegaConf.to_container(node, resolve=True)  # type: ignore[assignment]
    else:
        data = dict(node)
    data.pop("name", None)
    return _build(cls, data, where)


def _build(cls: type[T], data: dict[str, Any], where: str) -> T:
    fields = {f.name: f for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    hints = typing.get_type_hints(cls)
    kwargs: dict[str, Any] = {}
    for key, value in data.items():
        if key not in fields:
            close = difflib.get_close_matches(key, list(fields), n=1)
            hint = f" Did you mean '{where}.{close[0]}'?" if close else ""
            raise UserError(f"'{where}.{key}' is not an option of {cls.__name__}.{hint}")
        kwargs[key] = _coerce(value, hints[key], f"{where}.{key}")
    try:
        return cls(**kwargs)
    except (ValueError, TypeError) as exc:
        raise UserError(f"bad {where} config: {exc}") from exc


def _coerce(value: Any, hint: Any, key: str) -> Any:
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if origin is typing.Union or origin is types.UnionType:
        if value is None and type(None) in args:
            return None
        for arg in args:
            if arg is type(None):
                continue
            try:
                return _coerce(value, arg, key)
            except UserError:
                continue
        raise UserError(f"bad value for '{key}': {shown(value)} does not fit {hint}")
    if hint is bool:
        if isinstance(value, bool):
            return value
    elif hint is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
    elif hint is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
    elif hint is str:
        if isinstance(value, str):
            return value
    elif origin in (tuple, list):
        if isinstance(value, (list, tuple)):
            inner = args[0] if args else Any
            items = [v if inner is Any or inner is Ellipsis else _coerce(v, inner, key) for v in value]
            return tuple(items) if origin is tuple else items
    elif origin is dict or hint is dict:
        if isinstance(value, dict):
            return value
    elif dataclasses.is_dataclass(hint) and isinstance(hint, type):
        if isinstance(value, hint):
            return value
        if isinstance(value, Mapping):  # a nested node: every key of it is checked (no plugin `name` here)
            return _build(hint, dict(value), key)
    else:
        return value
    raise UserError(f"bad value for '{key}': expected {getattr(hint, '__name__', hint)}, got {shown(value)}")


def to_dict(obj: Any) -> dict[str, Any]:
    return dataclasses.asdict(obj)


def plain(node: Any) -> Any:
    """A config node as plain Python containers (DictConfig/ListConfig -> dict/list)."""
    from omegaconf import OmegaConf

    return OmegaConf.to_container(node, resolve=True) if OmegaConf.is_config(node) else node
