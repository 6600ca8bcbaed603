"""Contracts a plugin author can run: the checks every installed plugin passes in rlinf's own
suite, as functions a plugin's tests (or `rlinf check-plugin NAME`) call.

    from rlinf_cli.testing import check_model
    def test_contract():
        check_model("mymodel")     # raises ContractFailure naming each failed check

``*_checks(name)`` return the rows (check, passed, detail) without raising. The pytest plugin
(``rlinf_cli.testing.pytest_plugin``, registered under ``pytest11``) parametrises the fixtures
``rlinf_simulator``, ``rlinf_model``, ``rlinf_algorithm``, ``rlinf_accelerator``,
``rlinf_executor`` and ``rlinf_tool`` over the installed plugins of that kind.

Importing this package imports neither torch nor the registry: pytest loads the plugin at the
start of every run, so the checks import what they need when they run.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

from rlinf_cli.testing.plugins import CONTRACT_KINDS, installed, kinds_of, unknown_plugin
from rlinf_cli.testing.report import Check, ContractFailure, require
from rlinf_cli.testing.accelerator import accelerator_checks
from rlinf_cli.testing.algorithm import algorithm_checks
from rlinf_cli.testing.executor import executor_checks
from rlinf_cli.testing.model import model_checks
from rlinf_cli.testing.plugins import option, spec_of
from rlinf_cli.testing.report import Checks
from rlinf_cli.testing.simulator import simulator_checks
from rlinf_cli.testing.tool import tool_checks

__all__ = ["CONTRACT_KINDS", "Check", "ContractFailure", "check_accelerator", "check_algorithm", "check_executor",
           "check_model", "check_simulator", "check_tool", "contract_checks", "installed", "kinds_of", "model_checks_for",
           "unknown_plugin"]


def model_checks_for(name: str, factory: Callable[..., Any] | None = None,
                     config: dict[str, Any] | None = None) -> list[Check]:
    """Rows of the model contract for the installed model ``name`` (its factory and
    ``conf/model/NAME.yaml``), or for ``factory(config, env_spec)`` when given (not installed yet)."""
    if factory is None:
        spec = spec_of("model", name)
        checks = Checks()
        node: dict[str, Any] = {}
        if not checks.run(f"conf/model/{name}.yaml", lambda: node.update(option(spec, "model")) or ""):
            return checks.rows
        factory, config = spec.load(), node
    return model_checks(name, factory, config if config is not None else {"name": name})


def contract_checks(kind: str, name: str, workdir: Path | None = None) -> list[Check]:
    """Rows of ``kind``'s contract for the installed plugin ``name``; never raises for a failed check."""
    if kind in ("model", "algorithm") and spec_of(kind, name).attrs.get("modality") == "text":
        return [Check("contract", True, f"skipped: a text-modality {kind} is checked on a text task "
                      "(rlinf's tests/contracts/test_text_contract.py), not by these checks")]
    if kind == "model":
        return model_checks_for(name)
    if kind == "algorithm":
        return algorithm_checks(name, workdir)
    if kind == "simulator":
        return simulator_checks(name)
    if kind == "accelerator":
        return accelerator_checks(name)
    if kind == "executor":
        return executor_checks(name)
    if kind == "tool":
        return tool_checks(name, workdir)
    raise ValueError(f"no contract for kind {kind!r}; kinds: {', '.join(CONTRACT_KINDS)}")


def check_model(name: str, factory: Callable[..., Any] | None = None,
                config: dict[str, Any] | None = None) -> list[Check]:
    """The model contract; raises :class:`ContractFailure` (an AssertionError) naming what failed."""
    return require(f"model '{name}'", model_checks_for(name, factory, config))


def check_algorithm(name: str, workdir: Path | None = None) -> list[Check]:
    """The algorithm contract (RL or supervised, after its ``rollout``); tiny runs go to ``workdir``."""
    return require(f"algorithm '{name}'", contract_checks("algorithm", name, workdir))


def check_simulator(name: str) -> list[Check]:
    """The simulator contract: `rlinf check-sim`'s checks on ``conf/sim/NAME.yaml``."""
    return require(f"simulator '{name}'", contract_checks("simulator", name))


def check_accelerator(name: str) -> list[Check]:
    return require(f"accelerator '{name}'", contract_checks("accelerator", name))


def check_executor(name: str) -> list[Check]:
    return require(f"executor '{name}'", contract_checks("executor", name))


def check_tool(name: str, workdir: Path | None = None) -> list[Check]:
    """The tool contract: schema, its example call, odd arguments (files it needs go to ``workdir``)."""
    return require(f"tool '{name}'", contract_checks("tool", name, workdir))
