"""settings.build: frozen config dataclasses from config nodes, nested dataclasses included."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from rlinf_cli.errors import UserError
from rlinf_cli.settings import build


@dataclass(frozen=True)
class Inner:
    r: int = 0
    targets: tuple[str, ...] | str = ("a", "b")

    def __post_init__(self) -> None:
        if self.r < 0:
            raise ValueError(f"r must be >= 0, got {self.r}")


@dataclass(frozen=True)
class Outer:
    width: int = 4
    inner: Inner = field(default_factory=Inner)


def test_a_nested_node_becomes_its_dataclass_with_coerced_values():
    from omegaconf import OmegaConf

    got = build(Outer, OmegaConf.create({"name": "x", "width": 8, "inner": {"r": 16.0, "targets": ["q", "v"]}}), "model")
    assert got == Outer(8, Inner(16, ("q", "v")))
    assert isinstance(got.inner.r, int) and isinstance(got.inner.targets, tuple)
    assert build(Outer, {"inner": {"targets": "all-linear"}}, "model").inner == Inner(0, "all-linear")
    assert build(Outer, {}, "model").inner == Inner()  # absent: the field's default
    assert build(Outer, {"inner": Inner(3)}, "model").inner == Inner(3)  # already built: kept


@pytest.mark.parametrize("node, message", [
    ({"inner": {"rank": 8}}, "'model.inner.rank' is not an option of Inner"),
    ({"inner": {"r": "eight"}}, "bad value for 'model.inner.r'"),
    ({"inner": {"r": -1}}, "bad model.inner config: r must be >= 0"),
    ({"inner": 8}, "bad value for 'model.inner'"),
])
def test_a_bad_nested_value_is_one_line_naming_the_whole_key(node, message):
    with pytest.raises(UserError, match=message.replace(".", r"\.").replace("(", r"\(")) as info:
        build(Outer, node, "model")
    assert "\n" not in str(info.value)
