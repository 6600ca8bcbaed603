"""The house rules of rlinf_cli (tools/house.py): no import circles, deferred imports only where
they keep a heavy dependency off the import path, modules of at most 450 lines, stage/collector/
runtime functions of at most 60. A breach names the module (and line) and what to do."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tools"))
import house  # noqa: E402

FOUND = house.breaches()


@pytest.mark.parametrize("rule", list(FOUND))
def test_house_rule(rule):
    assert not FOUND[rule], f"{rule}:\n  " + "\n  ".join(FOUND[rule])


def test_the_checks_can_fail(tmp_path, monkeypatch):
    """A circle through a deferred import, a needless deferred import and a long module are found."""
    pkg = tmp_path / "rlinf_cli"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from rlinf_cli import b\n")
    (pkg / "b.py").write_text("def f():\n    from rlinf_cli.a import x\n" + "\n" * 460)
    monkeypatch.setattr(house, "ROOT", pkg)
    found = house.breaches()
    assert found["import circles"] == ["rlinf_cli.a <-> rlinf_cli.b"]
    assert len(found["needless deferred imports"]) == 1 and "rlinf_cli/b.py:2" in found["needless deferred imports"][0]
    assert len(found["long modules"]) == 1 and "rlinf_cli/b.py" in found["long modules"][0]
