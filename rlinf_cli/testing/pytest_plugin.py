"""rlinf's pytest plugin (entry point ``pytest11``): fixtures parametrised over installed plugins.

A test that takes ``rlinf_model`` (or ``rlinf_simulator``, ``rlinf_algorithm``,
``rlinf_accelerator``, ``rlinf_executor``, ``rlinf_tool``) runs once per installed plugin of that kind, with its
name; ``--rlinf-plugin NAME`` (repeatable) keeps only those names:

    from rlinf_cli.testing import check_model
    def test_every_model(rlinf_model):
        check_model(rlinf_model)

Text-modality models, algorithms and simulators are left out (their contract is the text-task
checks). A plugin registered with ``test_marker="x"`` (its component needs an opt-in install)
gets the pytest marker ``x``. pytest loads this module in every run: it imports nothing heavy.
"""

from __future__ import annotations

from typing import Any

import pytest
from rlinf_cli.testing.plugins import installed

FIXTURES = {"rlinf_simulator": "simulator", "rlinf_model": "model", "rlinf_algorithm": "algorithm",
            "rlinf_accelerator": "accelerator", "rlinf_executor": "executor", "rlinf_tool": "tool"}


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--rlinf-plugin", action="append", default=[], metavar="NAME",
                     help="rlinf contract fixtures (rlinf_model, ...): only the plugins of these names")


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    for fixture, kind in FIXTURES.items():
        if fixture in metafunc.fixturenames:
            metafunc.parametrize(fixture, _params(kind, metafunc.config.getoption("rlinf_plugin")))


def _params(kind: str, only: list[str]) -> list[Any]:
    specs = [s for s in installed(kind, embodied=kind != "accelerator") if not only or s.name in only]
    return [pytest.param(s.name, id=s.name, marks=[getattr(pytest.mark, s.attrs["test_marker"])]
                         if s.attrs.get("test_marker") else []) for s in specs]
