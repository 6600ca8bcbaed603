"""Release readiness: every package builds, passes the index's checks, installs by name from the
built artifacts into a fresh virtualenv, runs the whole loop there, and uninstalls cleanly.

Packages are found by tools/release.py (core + plugins*/*), never listed here; the plugins the
install test needs are found through the registry from the components the loop uses.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tarfile
import zipfile
from importlib import metadata
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tools"))

import release  # noqa: E402

# what the install test runs: one component of every plugin kind (their packages are looked up)
LOOP_COMPONENTS = {"simulator": ["metaworld"], "model": ["mlp"], "algorithm": ["bc", "ppo"],
                   "accelerator": ["cpu"], "executor": ["local"]}


def _makefile_plugins() -> list[str]:
    text = (REPO / "Makefile").read_text()
    block = text.split("PLUGINS :=", 1)[1].split("\n\n", 1)[0].split("PLUGIN_FILES", 1)[0]
    return [w for w in block.replace("\\", " ").split() if "/" in w]


def test_every_package_is_found_with_a_free_name_and_its_own_version():
    pkgs = release.packages()
    found = {p.path.relative_to(REPO).as_posix() for p in pkgs if not p.is_core}
    assert set(_makefile_plugins()) <= found, "a package the Makefile installs is not found by tools/release.py"
    names = [release.normalize(p.name) for p in pkgs]
    assert len(names) == len(set(names))
    assert "rlinf" not in names  # on the index, `rlinf` is another project
    from rlinf_cli import DISTRIBUTION, __version__

    core = release.core(pkgs)
    assert core.name == DISTRIBUTION and core.version == __version__
    assert metadata.version(DISTRIBUTION) == __version__, "reinstall: make install"
    for p in pkgs:
        assert p.version and (p.is_core or p.pyproject["project"].get("version")), p.name


def test_plugins_require_the_core_by_name_with_a_bounded_range():
    from packaging.requirements import Requirement
    from packaging.version import Version

    from rlinf_cli import DISTRIBUTION, __version__
    from rlinf_cli.scaffold import core_requirement

    for pkg in release.packages():
        if pkg.is_core:
            continue
        reqs = [Requirement(r) for r in pkg.pyproject["project"].get("dependencies", [])]
        assert not any(release.normalize(r.name) == "rlinf" for r in reqs), pkg.name
        if pkg.is_library:  # shared helper (rlinf-mujoco-gl): no entry point, needs no core
            assert not any(r.name == DISTRIBUTION for r in reqs), f"{pkg.name}: a library that needs the core is a plugin"
            continue
        (core,) = [r for r in reqs if r.name == DISTRIBUTION]
        assert Version(__version__) in core.specifier, f"{pkg.name}: {core} excludes the core {__version__}"
        assert any(s.operator == "<" for s in core.specifier), f"{pkg.name}: {core} has no upper bound"
    scaffold = Requirement(core_requirement())
    assert scaffold.name == DISTRIBUTION and Version(__version__) in scaffold.specifier
    assert Version("99.0") not in scaffold.specifier


def test_each_package_has_an_index_page_and_the_licence():
    problems = [p for pkg in release.packages() for p in release.check_readme(pkg)]
    assert problems == []
    licence = (REPO / "LICENSE").read_text()
    for pkg in release.packages():
        assert (pkg.path / "LICENSE").read_text() == licence, pkg.name


def _toy_package(root: Path, *, requires: str, ship_conf: bool) -> tuple[release.Package, Path, Path]:
    """A tiny plugin package and a hand-made wheel and sdist of it (no build needed)."""
    pkg_dir = root / "rlinf-sim-toy"
    (pkg_dir / "rlinf_sim_toy" / "conf" / "sim").mkdir(parents=True)
    (pkg_dir / "rlinf_sim_toy" / "__init__.py").write_text("")
    (pkg_dir / "rlinf_sim_toy" / "conf" / "sim" / "toy.yaml").write_text("name: toy\n")
    (pkg_dir / "pyproject.toml").write_text(
        '[project]\nname = "rlinf-sim-toy"\nversion = "0.1.0"\nreadme = "README.md"\n'
        f'dependencies = ["{requires}"]\n'
        '[tool.setuptools.packages.find]\ninclude = ["rlinf_sim_toy*"]\n')
    (pkg_dir / "README.md").write_text("# rlinf-sim-toy\n\nSee [the guide](../docs/plugins.md).\n")
    pkg = release._load(pkg_dir)
    dist = root / "dist"
    dist.mkdir()
    wheel = dist / "rlinf_sim_toy-0.1.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.writestr("rlinf_sim_toy/__init__.py", "")
        if ship_conf:
            zf.writestr("rlinf_sim_toy/conf/sim/toy.yaml", "name: toy\n")
        zf.writestr("rlinf_sim_toy-0.1.0.dist-info/METADATA",
                    f"Metadata-Version: 2.4\nName: rlinf-sim-toy\nVersion: 0.1.0\nRequires-Dist: {requires}\n\nshort")
        zf.writestr("rlinf_sim_toy-0.1.0.dist-info/entry_points.txt", "[console_scripts]\ntoy = x:y\n")
    sdist = dist / "rlinf_sim_toy-0.1.0.tar.gz"
    with tarfile.open(sdist, "w:gz") as tf:
        tf.add(pkg_dir / "pyproject.toml", "rlinf_sim_toy-0.1.0/pyproject.toml")
    return pkg, wheel, sdist


def test_the_checks_catch_a_broken_plugin_package(tmp_path):
    pkg, wheel, sdist = _toy_package(tmp_path, requires="rlinf>=0.1", ship_conf=False)
    names, meta, eps = release.read_wheel(wheel)
    with tarfile.open(sdist) as tf:
        sdist_names = {m.name for m in tf.getmembers()}
    core = release.core()
    problems = "\n".join(release.check_metadata(pkg, meta, eps, core) + release.check_contents(pkg, names, sdist_names)
                         + release.check_readme(pkg))
    assert "depends on 'rlinf', which on the index is another project" in problems
    assert "no dependency on the core 'rlinf-cli'" in problems
    assert "missing from the wheel, e.g. rlinf_sim_toy/conf/sim/toy.yaml" in problems
    assert "no entry point in the 'rlinf' group" in problems
    assert "no License-Expression" in problems and "no LICENSE in the wheel" in problems
    assert "sdist has no README.md" in problems
    assert "relative links ['../docs/plugins.md']" in problems
    assert "no '## Install' section" in problems


def test_the_checks_catch_an_unbounded_or_excluding_core_range(tmp_path):
    core = release.core()
    for requires, expected in ((f"{core.name}>=0.0", "no upper bound"), (f"{core.name}>=99,<100", "excludes the core")):
        root = tmp_path / expected.replace(" ", "_")
        root.mkdir()
        pkg, wheel, _ = _toy_package(root, requires=requires, ship_conf=True)
        names, meta, eps = release.read_wheel(wheel)
        assert any(expected in p for p in release.check_metadata(pkg, meta, eps, core)), requires


# -- built from the source tree (slow) -----------------------------------------------------------
@pytest.fixture(scope="module")
def dist_dir(tmp_path_factory) -> Path:
    """Wheels and sdists of every package, built with the standard front end from this tree."""
    out = tmp_path_factory.mktemp("dist")
    release.build(out, isolation=False)  # `make dist` builds isolated; here the venv's setuptools
    return out


@pytest.mark.slow
def test_every_package_builds_and_passes_the_release_checks(dist_dir):
    pkgs = release.packages()
    for pkg in pkgs:
        wheel, sdist = release.artifacts_of(pkg, dist_dir)
        assert wheel is not None and sdist is not None, pkg.name
    assert release.check(dist_dir, pkgs) == []


def _run(cmd: list[str], cwd: Path, env: dict, timeout: float = 900) -> subprocess.CompletedProcess:
    res = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    return res


def _link_torch(venv: Path) -> bool:
    """This environment's torch in ``venv`` as links to its packages and a copy of its metadata (a
    copy: nothing pip does in ``venv`` may reach the original through a link); False, leaving
    ``venv`` untouched, where torch is not laid out as one wheel's top-level packages."""
    dist = metadata.distribution("torch")
    tops = {Path(str(f)).parts[0] for f in dist.files or []} - {".."}
    sources = {top: Path(str(dist.locate_file(top))) for top in tops}
    sites = list((venv / "lib").glob("python*/site-packages"))
    if len(sites) != 1 or not any(t.endswith(".dist-info") for t in tops) or not all(p.exists() for p in sources.values()):
        return False
    for top, src in sources.items():
        if top.endswith(".dist-info"):
            shutil.copytree(src, sites[0] / top)
        else:
            (sites[0] / top).symlink_to(src, target_is_directory=src.is_dir())
    return True


@pytest.mark.slow
def test_fresh_virtualenv_installs_plugins_by_name_runs_the_loop_and_uninstalls(dist_dir, tmp_path):
    from rlinf_cli import DISTRIBUTION
    from rlinf_cli.registry import get_registry

    reg = get_registry()
    wanted = {reg.get(kind, name).package for kind, names in LOOP_COMPONENTS.items() for name in names}
    for kind in LOOP_COMPONENTS:  # a kind the core serves itself (cpu) still gets one plugin package installed
        if all(reg.get(kind, n).package == DISTRIBUTION for n in LOOP_COMPONENTS[kind]):
            wanted.add(sorted(s.package for s in reg.specs(kind).values() if s.package != DISTRIBUTION)[0])
    wanted = sorted(wanted)
    sim_package = reg.get("simulator", "metaworld").package
    venv = tmp_path / "venv"
    work = tmp_path / "work"
    work.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
    env.update(PATH=f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}", COLUMNS="200", PIP_DISABLE_PIP_VERSION_CHECK="1")
    py, rlinf = str(venv / "bin" / "python"), str(venv / "bin" / "rlinf")
    try:
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
        # as the Makefile: torch first, at this environment's version; linked in from this
        # environment where it can be (pip then installs only torch's own dependencies), since
        # unpacked again it would add ~0.9 GB to the suite's peak disk use (a CI run failed writing a
        # checkpoint, apparently on a full disk, while this test held its venv)
        _link_torch(venv)
        torch_version = metadata.version("torch").split("+")[0]
        res = _run([py, "-m", "pip", "install", "-q", "--no-compile", f"torch=={torch_version}"], work, env)
        assert res.returncode == 0, res.stderr[-3000:]
        res = _run([py, "-m", "pip", "install", "-q", "--no-compile", "--find-links", str(dist_dir), *wanted], work, env)
        assert res.returncode == 0, res.stderr[-3000:]

        # the core came by name from the built wheel, into this venv, not from the source tree
        probe = ("import json, rlinf_cli; from importlib import metadata as m; d = m.distribution('rlinf-cli'); "
                 "print(json.dumps({'file': rlinf_cli.__file__, 'version': d.version, "
                 "'direct_url': d.read_text('direct_url.json'), 'requires': d.requires}))")
        res = _run([py, "-c", probe], work, env)
        assert res.returncode == 0, res.stderr
        info = json.loads(res.stdout)
        assert Path(info["file"]).resolve().is_relative_to(venv.resolve()), info
        assert info["direct_url"] is None or '"editable": true' not in info["direct_url"]
        assert info["version"] == release.core().version

        res = _run([rlinf, "plugins", "list", "--json"], work, env)
        assert res.returncode == 0, res.stderr
        listed = {(r["kind"], r["name"]): r["package"] for r in json.loads(res.stdout)}
        for kind, names in LOOP_COMPONENTS.items():
            for name in names:
                assert listed.get((kind, name)) == reg.get(kind, name).package, (kind, name, listed)
        assert set(listed.values()) == set(wanted) | {DISTRIBUTION}  # nothing leaked in from the dev environment

        off = ["tracking.enabled=false", "progress=false"]
        steps = [
            ["collect", "sim=metaworld", "sim.task=reach-v3", "policy=expert", "episodes=2", "num_envs=2",
             "output=data/reach", "run_dir=runs/collect", *off],
            ["sft", "dataset=data/reach", "algo.epochs=3", "val_fraction=0", "eval.episodes=0", "run_dir=runs/sft", *off],
            ["rl", "init=runs/sft/checkpoints/best", "total_steps=512", "num_envs=2", "eval.episodes=0",
             "run_dir=runs/rl", *off],
            ["eval", "checkpoint=runs/rl/checkpoints/final", "episodes=2", "num_envs=2", "progress=false"],
        ]
        for args in steps:
            res = _run([rlinf, *args], work, env, timeout=600)
            assert res.returncode == 0, f"rlinf {' '.join(args)}:\n{res.stderr[-3000:]}"
        meta = json.loads((work / "data" / "reach" / "meta.json").read_text())
        assert sum(c["episodes"] for c in meta["chunks"]) == 2
        result = json.loads(res.stdout[res.stdout.rindex("\n{") + 1:])
        assert result["episodes"] == 2 and 0.0 <= result["success_once"] <= 1.0
        assert (work / "rlinf_runs" / "mlflow.db").is_file()  # eval tracked into the embedded store

        res = _run([py, "-m", "pip", "uninstall", "-y", "-q", sim_package], work, env)
        assert res.returncode == 0, res.stderr
        res = _run([rlinf, "plugins", "list", "--json"], work, env)
        assert all(r["name"] != "metaworld" for r in json.loads(res.stdout))
        res = _run([rlinf, "eval", "sim=metaworld", "checkpoint=random"], work, env)
        assert res.returncode == 2 and "unknown simulator 'metaworld'" in res.stderr, res.stderr
        assert "Traceback" not in res.stderr
        res = _run([py, "-c", f"import importlib.metadata as m; m.version('{DISTRIBUTION}')"], work, env)
        assert res.returncode == 0  # the core stays
    finally:
        shutil.rmtree(venv, ignore_errors=True)  # ~1.5 GB
