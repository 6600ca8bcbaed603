"""The plugin API version a plugin declares (``RLINF_API``) and the registry checks, and what
``register(..., default=...)`` means."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pluggy
import pytest

from rlinf_cli import hookspecs, registry
from rlinf_cli.api import API_VERSION
from rlinf_cli.errors import UserError
from rlinf_cli.registry import STAGES, Registry

MAJOR = int(API_VERSION.split(".")[0])


def _plugin(api: str | None, name: str = "sim_x", default: object = False) -> object:
    class _P:
        @hookspecs.hookimpl
        def register_simulators(self, register):
            register(name, "os.path:join", summary="a fake", default=default)

    if api is not None:
        _P.RLINF_API = api
    return _P()


def _registry(*plugins: object, package: str = "rlinf-sim-x") -> Registry:
    pm = pluggy.PluginManager("rlinf")
    pm.add_hookspecs(hookspecs)
    dists = {}
    for i, p in enumerate(plugins):
        pm.register(p, name=f"p{i}")
        dists[id(p)] = (package if i == 0 else f"{package}-{i}", "0.3.0")
    return Registry(pm, dists)


@pytest.fixture(autouse=True)
def _fresh_warnings(monkeypatch):
    monkeypatch.setattr(registry, "_warned", set())


def test_a_matching_plugin_is_used_without_a_word(capsys):
    reg = _registry(_plugin(API_VERSION))
    assert reg.load("simulator", "sim_x") is os.path.join
    assert not reg.incompatible and capsys.readouterr().err == ""


@pytest.mark.parametrize("declared, advice", [(f"{MAJOR + 1}.0", "upgrade rlinf-cli"),
                                              (f"{MAJOR - 1}.4", "upgrade the plugin")])
def test_another_major_is_named_in_one_line_and_refused(declared, advice):
    reg = _registry(_plugin(declared))
    problem = reg.incompatible["rlinf-sim-x"]
    assert "\n" not in problem and advice in problem
    # which package, the version it declares, the one the core speaks
    assert "rlinf-sim-x 0.3.0" in problem and declared in problem and API_VERSION in problem
    spec = next(s for s in reg.all_specs() if s.name == "sim_x")  # still listed, marked
    assert spec.problem == problem
    with pytest.raises(UserError, match="simulator 'sim_x' cannot be used: plugin package rlinf-sim-x"):
        reg.get("simulator", "sim_x")
    with pytest.raises(UserError, match="cannot be used"):
        spec.load()


def test_an_incompatible_plugin_is_never_a_default():
    reg = _registry(_plugin(f"{MAJOR + 1}.0", default=True))
    assert reg.default("simulator", "rl") is None


def test_a_plugin_that_declares_nothing_is_compatible_with_one_warning_on_use(capsys):
    reg = _registry(_plugin(None, "a"), _plugin(None, "b"), package="rlinf-sim-old")
    assert capsys.readouterr().err == ""  # not on every command: an unrelated error stays one line
    assert "rlinf-sim-old 0.3.0 declares no plugin API version" in reg.api_notes["rlinf-sim-old"]
    reg2 = _registry(_plugin(None, "a"), package="rlinf-sim-old")
    assert reg.load("simulator", "a") is os.path.join and reg2.load("simulator", "a") is os.path.join
    assert reg.load("simulator", "a") is os.path.join
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and "rlinf-sim-old 0.3.0 declares no plugin API version" in err[0]
    assert f'RLINF_API = "{API_VERSION}"' in err[0]


def test_a_newer_minor_works_with_a_warning_on_use(capsys):
    reg = _registry(_plugin(f"{MAJOR}.99"))
    assert reg.load("simulator", "sim_x") is os.path.join
    assert "upgrade rlinf-cli" in capsys.readouterr().err


def test_a_malformed_declaration_is_refused():
    reg = _registry(_plugin("one"))
    assert "not \"MAJOR.MINOR\"" in reg.incompatible["rlinf-sim-x"]


def test_a_hook_of_another_api_that_raises_does_not_break_the_registry():
    class _P:
        RLINF_API = f"{MAJOR + 1}.0"

        @hookspecs.hookimpl
        def register_simulators(self, register):
            register("sim_y", "os.path:join", a_keyword_this_core_does_not_know=object(), default=object())

    reg = _registry(_P())
    assert "rlinf-sim-x" in reg.incompatible and not reg.specs("simulator")


def test_bundled_plugins_and_scaffolds_declare_this_api():
    root = Path(__file__).resolve().parents[2]
    hooks = [p for d in ("plugins", "plugins_sims", "plugins_models", "templates") for p in (root / d).rglob("plugin.py")]
    assert len(hooks) >= 15
    for path in hooks:
        assert f'\nRLINF_API = "{API_VERSION}"' in path.read_text(), path
    from rlinf_cli.registry import get_registry

    reg = get_registry()
    assert not reg.incompatible and not reg.api_notes, (reg.incompatible, reg.api_notes)


# -- default ----------------------------------------------------------------------------------
def test_default_true_is_every_stage_and_a_tuple_names_stages():
    reg = _registry(_plugin(API_VERSION, "everywhere", default=True), _plugin(API_VERSION, "rl_only", default=("rl",)),
                    _plugin(API_VERSION, "never"))
    specs = reg.specs("simulator")
    assert specs["everywhere"].default == STAGES and specs["rl_only"].default == ("rl",) and specs["never"].default == ()
    assert reg.default("simulator", "rl") == "everywhere"  # several: the first by name
    assert reg.default("simulator", "sft") == "everywhere"
    reg = _registry(_plugin(API_VERSION, "rl_only", default=("rl",)))
    assert reg.default("simulator", "rl") == "rl_only" and reg.default("simulator", "eval") is None


@pytest.mark.parametrize("bad", [("RL",), 1, ("rl", 2)])
def test_a_bad_default_fails_loudly_naming_the_plugin(bad):
    with pytest.raises(RuntimeError, match="sim_x' from rlinf-sim-x: default"):
        _registry(_plugin(API_VERSION, default=bad))


def test_bundled_defaults_per_stage():
    from rlinf_cli.config import default_choice

    assert default_choice("rl", "algo") == "ppo" and default_choice("sft", "algo") == "bc"
    assert default_choice("rl", "model") == "mlp" and default_choice("eval", "executor") == "local"


# -- the CLI, with a plugin installed that was built for another major ---------------------
def _future_site(site: Path) -> dict[str, str]:
    pkg = site / "rlinf_sim_future"
    (pkg / "conf" / "sim").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "plugin.py").write_text(
        "from rlinf_cli.api import hookimpl\n\n"
        f'RLINF_API = "{MAJOR + 1}.0"\n\n\n'
        "@hookimpl\n"
        "def register_simulators(register):\n"
        '    register("future_sim", "rlinf_sim_future.plugin:nothing", summary="built for the next API")\n')
    (pkg / "conf" / "sim" / "future_sim.yaml").write_text("name: future_sim  # the registered name\n")
    info = site / "rlinf_sim_future-0.1.0.dist-info"  # what pip would write
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: rlinf-sim-future\nVersion: 0.1.0\n")
    (info / "entry_points.txt").write_text("[rlinf]\nfuture = rlinf_sim_future.plugin\n")
    path = os.pathsep.join(filter(None, [str(site), os.environ.get("PYTHONPATH", "")]))
    return {"PYTHONPATH": path}


def test_plugins_list_marks_it_and_using_it_is_exit_2(cli_proc, workdir):
    env = _future_site(workdir / "site")
    res = cli_proc("plugins", "list", env=env)
    assert res.code == 0, res.err
    assert "future_sim (incompatible)" in res.out
    line = next(x for x in res.out.splitlines() if x.startswith("incompatible:"))
    assert "rlinf-sim-future 0.1.0" in line and f"{MAJOR + 1}.0" in line and API_VERSION in line
    rows = json.loads(cli_proc("plugins", "list", "--json", env=env).out)
    assert next(r for r in rows if r["name"] == "future_sim")["compatible"] is False
    assert all(r["compatible"] and r["api_warning"] is None for r in rows if r["name"] != "future_sim")
    res = cli_proc("check-sim", "sim=future_sim", env=env)
    assert res.code == 2, res.err
    assert "Traceback" not in res.err and "simulator 'future_sim' cannot be used" in res.err
