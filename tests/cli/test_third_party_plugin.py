"""A plugin package made outside the repo installs with pip, shows up, works by name, and goes away."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

PIP = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q"]


@pytest.mark.slow
def test_scaffolded_plugin_installs_lists_runs_and_uninstalls(cli_proc, workdir):
    res = cli_proc("plugins", "new", "toyline_t", "--kind", "simulator", "--dir", str(workdir))
    assert res.code == 0, res.err
    pkg = workdir / "rlinf-sim-toyline-t"
    assert (pkg / "rlinf_sim_toyline_t" / "conf" / "sim" / "toyline_t.yaml").is_file()
    subprocess.run([*PIP, "install", "--no-deps", "--no-build-isolation", str(pkg)], check=True, timeout=300)
    try:
        listed = json.loads(cli_proc("plugins", "list", "--json").out)
        row = next(r for r in listed if r["name"] == "toyline_t")
        assert row == {**row, "kind": "simulator", "package": "rlinf-sim-toyline-t", "version": "0.1.0"}
        res = cli_proc("eval", "sim=toyline_t", "checkpoint=expert", "episodes=6", "tracking.enabled=false")
        assert res.code == 0, res.err
        assert res.json_tail()["success_once"] == 1.0  # the scaffold's expert solves its task
        res = cli_proc("rl", "sim=toyline_t", "total_steps=4000", "eval.episodes=4", "tracking.enabled=false")
        assert res.code == 0, res.err
    finally:
        subprocess.run([*PIP, "uninstall", "-y", "rlinf-sim-toyline-t"], check=True, timeout=300)
    listed = json.loads(cli_proc("plugins", "list", "--json").out)
    assert all(r["name"] != "toyline_t" for r in listed)
    res = cli_proc("eval", "sim=toyline_t", "checkpoint=random")
    assert res.code == 2 and "unknown simulator 'toyline_t'" in res.err


@pytest.mark.parametrize("kind", ["model", "algorithm"])
def test_scaffolds_for_other_kinds_are_importable(kind, workdir, monkeypatch):
    from rlinf_cli.scaffold import new_plugin

    path = new_plugin("demo_x", kind, workdir)
    monkeypatch.syspath_prepend(str(path))
    package = path.name.replace("-", "_")
    mod = __import__(f"{package}.plugin", fromlist=["x"])
    registered = []
    hook = getattr(mod, "register_models" if kind == "model" else "register_algorithms")
    hook(register=lambda name, factory, **kw: registered.append((name, factory)))
    assert registered and registered[0][0] == "demo_x"
    module, attr = registered[0][1].split(":")
    assert getattr(__import__(module, fromlist=[attr]), attr) is not None
