"""A stage that needs a kind of plugin nothing installed provides (a fresh venv with a simulator
plugin alone) names the package to install: the one the simulator's `train` extra lists for that
kind, read from its installed metadata (the core names no plugin), or else the naming convention."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
TRAIN = ["rlinf-algos>=0.1.0,<0.2", "rlinf-model-mlp>=0.1.0,<0.2", "rlinf-executor-local>=0.1.0,<0.2"]
EVERY_MODEL = "model-mlp,model-hf,model-vla"


def _fake_sim(site: Path, name: str, train: list[str]) -> None:
    """A simulator plugin distribution ``rlinf-sim-<name>`` (what pip would write), its ``train``
    extra listing ``train``. It registers a simulator whose config option exists; nothing builds it."""
    package = f"rlinf_sim_{name}"
    (site / package / "conf" / "sim").mkdir(parents=True)
    (site / package / "__init__.py").write_text(
        "from rlinf_cli.hookspecs import hookimpl\n\n\n@hookimpl\ndef register_simulators(register):\n"
        f"    register({name!r}, 'rlinf_sim_gymnasium.sim:GymnasiumSimulator', summary='test')\n")
    (site / package / "conf" / "sim" / f"{name}.yaml").write_text(f"name: {name}  # the simulator\n")
    info = site / f"{package}-0.1.0.dist-info"
    info.mkdir()
    requires = "".join(f'Requires-Dist: {r}; extra == "train"\n' for r in train)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: rlinf-sim-{name}\nVersion: 0.1.0\n"
                                   "Requires-Dist: rlinf-cli<0.2,>=0.1.0\n"
                                   + ("Provides-Extra: train\n" if train else "") + requires)
    (info / "entry_points.txt").write_text(f"[rlinf]\nsim-{name} = {package}\n")


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    site = tmp_path_factory.mktemp("site")
    _fake_sim(site, "trainfake", TRAIN)
    _fake_sim(site, "plainfake", [])
    return site


def _env(site: Path, blocked: str) -> dict[str, str]:
    return {"PYTHONPATH": os.pathsep.join(filter(None, [str(site), os.environ.get("PYTHONPATH", "")])),
            "RLINF_BLOCK_PLUGINS": blocked}


@pytest.mark.parametrize("blocked, kind, package", [
    (EVERY_MODEL, "model", "rlinf-model-mlp"),
    ("algos", "algorithm", "rlinf-algos"),
    ("executor-local,executor-ray", "executor", "rlinf-executor-local"),
], ids=["model", "algorithm", "executor"])
def test_a_missing_kind_names_the_package_the_simulators_train_extra_lists(site, cli_proc, blocked, kind, package):
    res = cli_proc("rl", "sim=trainfake", env=_env(site, blocked))
    assert res.code == 2 and "Traceback" not in res.err, res.err
    line = res.err.strip()
    assert len(line.splitlines()) == 1, line
    assert f"no {kind} installed" in line and f"`pip install {package}`" in line, line
    assert "rlinf-sim-trainfake[train]" in line, line  # and the one command that installs them all


def test_without_a_train_extra_the_naming_convention_is_the_hint(site, cli_proc):
    res = cli_proc("rl", "sim=plainfake", env=_env(site, EVERY_MODEL))
    assert res.code == 2 and "Traceback" not in res.err, res.err
    line = res.err.strip()
    assert len(line.splitlines()) == 1 and "no model installed" in line and "rlinf-model-<name>" in line, line


def test_every_bundled_simulator_has_a_train_extra_that_completes_it():
    """`pip install 'rlinf-sim-X[train]'` brings a model, an algorithm and an executor for it: the
    extra lists packages of this repository, with ranges that hold their versions."""
    sys.path.insert(0, str(REPO / "tools"))
    import release
    from packaging.requirements import Requirement
    from packaging.version import Version

    from rlinf_cli.registry import get_registry

    pkgs = {release.normalize(p.name): p for p in release.packages()}
    provides: dict[str, set[str]] = {}
    for spec in get_registry().all_specs():
        provides.setdefault(release.normalize(spec.package), set()).add(spec.kind)
    sims = [p for p in pkgs.values() if p.path.parent.name == "plugins_sims" and not p.is_library]
    assert len(sims) >= 6
    for sim in sims:
        train = [Requirement(r) for r in sim.pyproject["project"].get("optional-dependencies", {}).get("train", [])]
        assert train, f"{sim.name} has no `train` extra"
        kinds: set[str] = set()
        for req in train:
            target = pkgs.get(release.normalize(req.name))
            assert target is not None, f"{sim.name}[train] lists {req.name}, not a package of this repository"
            assert Version(target.version) in req.specifier and not list(req.specifier.filter(["99.0"])), (sim.name, str(req))
            kinds |= provides.get(release.normalize(req.name), set())
        assert {"model", "algorithm", "executor"} <= kinds, (sim.name, kinds)
