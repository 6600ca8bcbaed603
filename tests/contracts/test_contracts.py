"""One contract test per registered plugin, through rlinf_cli.testing (the checks a plugin's own
tests and `rlinf check-plugin` run): construction, a tiny run, seeded determinism, save/load or
resume, and behaviour (a supervised loss that falls, an accelerator that is what it claims).

Parametrised over whatever is installed (the fixtures ``rlinf_<kind>`` of rlinf's pytest plugin),
so a new plugin is covered the moment it registers.
"""

from __future__ import annotations

import numpy as np

from rlinf_cli.api import ArraySpec, EnvSpec
from rlinf_cli.testing import (check_accelerator, check_algorithm, check_executor, check_model, check_simulator,
                               check_tool)


def test_simulator_contract(rlinf_simulator):
    """The checks of `rlinf check-sim`: spec, pickling, reset/step shapes, seeded determinism, expert."""
    rows = check_simulator(rlinf_simulator)
    assert len(rows) >= 8, rows


def test_model_contract(rlinf_model):
    check_model(rlinf_model)


def test_algorithm_contract(rlinf_algorithm, workdir):
    """RL: a fixed batch's loss falls, two seeded runs agree, a resumed run ends where the full run
    ends. Supervised: a short training's loss falls, two seeded runs agree."""
    check_algorithm(rlinf_algorithm, workdir)


def test_accelerator_contract(rlinf_accelerator):
    check_accelerator(rlinf_accelerator)


def test_executor_contract(rlinf_executor):
    check_executor(rlinf_executor)


def test_tool_contract(rlinf_tool, workdir):
    """A schema a chat template takes, its example call answered in time, odd arguments met with
    text or a ToolError."""
    rows = check_tool(rlinf_tool, workdir)
    assert len(rows) >= 4, rows


class _DriftingSim:
    """Breaks the contract: its observation shape disagrees with its spec and reset ignores the seed."""

    spec = EnvSpec({"state": ArraySpec((3,), "float32")}, ArraySpec((), "int64"), num_actions=2)

    class _Env:
        def reset(self, *, seed=None):
            return {"state": np.random.rand(4).astype(np.float32)}, {}

        def step(self, a):
            return {"state": np.random.rand(4).astype(np.float32)}, float(np.random.rand()), False, False, {}

        def close(self):
            pass

    def make_env(self, index):
        return self._Env()

    def expert(self):
        return None


def test_check_sim_catches_a_broken_simulator():
    from rlinf_cli.checks import check_simulator as rows_of

    rows = {name: (ok, detail) for name, ok, detail in rows_of(_DriftingSim())}
    assert rows["reset(seed) returns observations matching the spec"][0] is False
    assert "shape (4,) != spec (3,)" in rows["reset(seed) returns observations matching the spec"][1]
    assert rows["the same seed gives the same initial state"][0] is False
    assert rows["step() returns (obs, reward, terminated, truncated, info); seeded determinism"][0] is False
    assert rows["reset(seed) + the same actions replay an episode exactly (resume relies on it)"][0] is False


def test_the_fixtures_cover_every_installed_plugin():
    """The parametrised fixtures are the registry's plugins (text-modality ones have their own checks)."""
    from rlinf_cli.registry import get_registry

    reg = get_registry()
    assert {"mlp"} <= set(reg.specs("model")) and {"ppo", "bc", "sac"} <= set(reg.specs("algorithm"))
    assert {"cpu", "cuda", "rocm", "ascend", "musa"} <= set(reg.specs("accelerator"))
