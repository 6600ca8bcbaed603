"""Plugin registry: lazy factories, loud duplicates, helpful misses, blocking."""

from __future__ import annotations

import pluggy
import pytest

from rlinf_cli import hookspecs
from rlinf_cli.errors import UserError
from rlinf_cli.registry import Registry, get_registry, unknown_name_message


class _SimA:
    @hookspecs.hookimpl
    def register_simulators(self, register):
        register("twin", "os.path:join", summary="first")


class _SimB:
    @hookspecs.hookimpl
    def register_simulators(self, register):
        register("twin", "os.path:split", summary="second")


class _Bad:
    @hookspecs.hookimpl
    def register_models(self, register):
        register("nofactory", "not_a_module_attr")


def _pm(*plugins) -> pluggy.PluginManager:
    pm = pluggy.PluginManager("rlinf")
    pm.add_hookspecs(hookspecs)
    for i, p in enumerate(plugins):
        pm.register(p, name=f"p{i}")
    return pm


def test_duplicate_names_fail_loudly():
    with pytest.raises(RuntimeError, match="duplicate simulator name 'twin'"):
        Registry(_pm(_SimA(), _SimB()))


def test_factory_must_be_module_attr():
    with pytest.raises(RuntimeError, match="module:attr"):
        Registry(_pm(_Bad()))


def test_factories_are_lazy_and_load_on_use():
    reg = Registry(_pm(_SimA()))
    spec = reg.get("simulator", "twin")
    assert spec.factory == "os.path:join"
    import os.path

    assert spec.load() is os.path.join


def test_unknown_name_lists_installed_and_suggests():
    msg = unknown_name_message("algorithm", "ppp", ["bc", "grpo", "ppo"])
    assert "Installed: bc, grpo, ppo" in msg and "Did you mean 'ppo'" in msg and "pip install rlinf-algo-ppp" in msg
    with pytest.raises(UserError, match="unknown simulator 'nope'"):
        get_registry().get("simulator", "nope")


def test_failed_factory_import_is_a_user_error():
    class _Broken:
        @hookspecs.hookimpl
        def register_simulators(self, register):
            register("broken", "no_such_module_xyz:Thing")

    reg = Registry(_pm(_Broken()))
    with pytest.raises(UserError, match="failed to load"):
        reg.load("simulator", "broken")


def test_blocked_plugins_disappear(cli_proc):
    res = cli_proc("plugins", "list", "--json", env={"RLINF_BLOCK_PLUGINS": "algos"})
    assert res.code == 0
    assert '"ppo"' not in res.out and '"gymnasium"' in res.out


def test_defaults_per_stage():
    from rlinf_cli.config import default_choice

    assert default_choice("rl", "algo") == "ppo"
    assert default_choice("sft", "algo") == "bc"
    assert default_choice("rl", "accelerator") == "auto"
