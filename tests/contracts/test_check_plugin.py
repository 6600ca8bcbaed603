"""`rlinf check-plugin` and the scaffolds' shipped contract tests: a model and an algorithm made with
`rlinf plugins new` pass unchanged; deliberately broken ones fail with a line naming what is wrong.

The fast tests register a scaffold in this process's registry, as pip would, without installing
it; the slow one installs both scaffolds into the environment and removes them again.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from rlinf_cli.registry import Spec, get_registry

PIP = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q"]
HOOKS = {"model": "register_models", "algorithm": "register_algorithms", "simulator": "register_simulators",
         "robot": "register_simulators"}


def _scaffold(name: str, kind: str, where: Path, monkeypatch: pytest.MonkeyPatch, edit=None) -> Path:
    """``rlinf plugins new NAME --kind KIND``, optionally edited (``edit(path)``), then registered."""
    from rlinf_cli.scaffold import new_plugin

    path = new_plugin(name, kind, where)
    if edit is not None:
        edit(path / path.name.replace("-", "_"))
    monkeypatch.syspath_prepend(str(path))
    package = path.name.replace("-", "_")
    plugin = __import__(f"{package}.plugin", fromlist=["x"])
    specs: list[Spec] = []
    registered = "simulator" if kind == "robot" else kind  # a robot is a simulator plugin
    getattr(plugin, HOOKS[kind])(register=lambda n, factory, **kw: specs.append(
        Spec(registered, n, factory, kw.get("summary", ""), False, path.name, "0.1.0", path / package / "conf", kw)))
    monkeypatch.setitem(get_registry()._specs[registered], name, specs[0])
    for mod in [m for m in sys.modules if m == package or m.startswith(package + ".")]:
        monkeypatch.delitem(sys.modules, mod)  # imported again on use, from this directory; gone after the test
    return path


def _replace(file: str, old: str, new: str):
    def edit(package_dir: Path) -> None:
        path = package_dir / file
        text = path.read_text()
        assert old in text, f"the scaffold's {file} changed: update this test's edit"
        path.write_text(text.replace(old, new))

    return edit


def _error_lines(res) -> list[str]:
    return [ln for ln in res.err.splitlines() if ln.startswith("error: ")]


def test_a_scaffolded_model_passes(cli, workdir, monkeypatch):
    _scaffold("cp_model", "model", workdir, monkeypatch)
    res = cli("check-plugin", "cp_model")
    assert res.code == 0, res.err
    assert "FAIL" not in res.out and res.out.count("pass") == 20, res.out


@pytest.mark.parametrize("kind", ["simulator", "robot"])
def test_scaffolded_simulators_pass_their_shipped_contract(kind, workdir, monkeypatch):
    """The simulator and robot scaffolds ship the same test; here it is, as the scaffold wrote it."""
    import importlib.util

    path = _scaffold(f"cp_{kind}", kind, workdir, monkeypatch)
    shipped = path / "tests" / f"test_cp_{kind}_contract.py"
    spec = importlib.util.spec_from_file_location(f"shipped_{kind}", shipped)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    tests = [getattr(module, n) for n in dir(module) if n.startswith("test_")]
    assert len(tests) == 1
    tests[0]()  # raises ContractFailure naming the failed checks


def test_a_model_whose_act_returns_wrong_shapes_fails_naming_it(cli, workdir, monkeypatch):
    _scaffold("cp_bad_model", "model", workdir, monkeypatch, _replace(
        "model.py", "return ActOutput(action, dist.log_prob(action), self.get_value(obs))",
        "return ActOutput(action, dist.log_prob(action).unsqueeze(-1), self.get_value(obs))"))
    res = cli("check-plugin", "cp_bad_model")
    assert res.code == 2 and "FAIL" in res.out
    lines = _error_lines(res)
    assert len(lines) == 2 and all("act() returned logprob of shape (6, 1); expected (6,)" in ln for ln in lines), res.err
    assert "Traceback" not in res.err


def test_a_scaffolded_algorithm_passes(cli, workdir, monkeypatch):
    _scaffold("cp_algo", "algorithm", workdir / "plugins", monkeypatch)
    res = cli("check-plugin", "cp_algo")
    assert res.code == 0, res.err
    assert "FAIL" not in res.out and res.out.count("pass") == 6, res.out
    assert "bit-identical" in res.out


@pytest.mark.parametrize("old,new,message", [
    ("loss = pg + self.config.value_coef * value", "loss = pg + self.config.value_coef * value + float('nan')",
     "loss() returned nan on a fixed minibatch"),
    ("pg = -masked_mean(out.logprob * mb.advantages, mb.mask)\n        value = 0.5 * ((out.value - mb.returns) ** 2).mean()",
     "pg = -masked_mean(out.logprob.detach() * mb.advantages, mb.mask)\n"
     "        value = 0.5 * ((out.value.detach() - mb.returns) ** 2).mean()",
     "loss() returned a loss with no gradient to the policy"),
], ids=["nan", "detached"])
def test_a_broken_algorithm_fails_naming_it(old, new, message, cli, workdir, monkeypatch):
    _scaffold("cp_bad_algo", "algorithm", workdir / "plugins", monkeypatch, _replace("algo.py", old, new))
    res = cli("check-plugin", "cp_bad_algo")
    assert res.code == 2
    lines = _error_lines(res)
    assert lines and message in lines[0], res.err
    assert lines[0].startswith("error: algorithm 'cp_bad_algo': loss() on a fixed minibatch"), lines


class StuckBC:
    """A supervised algorithm whose loss carries no gradient: training leaves it where it started."""

    @staticmethod
    def make():
        from rlinf_algos.bc import BC

        class Stuck(BC):
            name = "stuck"

            def supervised_loss(self, policy, mb):
                loss = super().supervised_loss(policy, mb).detach()
                return loss + 0.0 * sum(p.sum() for p in policy.parameters())

        return Stuck


def test_a_supervised_algorithm_whose_loss_does_not_fall_fails(cli, workdir, monkeypatch):
    bc = get_registry().get("algorithm", "bc")
    conf = workdir / "stuck_conf"
    (conf / "algo").mkdir(parents=True)
    (conf / "algo" / "stuck.yaml").write_text((bc.conf_dir / "algo" / "bc.yaml").read_text().replace("name: bc", "name: stuck"))
    monkeypatch.setattr(sys.modules[__name__], "Stuck", StuckBC.make(), raising=False)
    monkeypatch.setitem(get_registry()._specs["algorithm"], "stuck",
                        Spec("algorithm", "stuck", f"{__name__}:Stuck", "", False, "test", "0", conf))
    res = cli("check-plugin", "stuck")
    assert res.code == 2
    lines = _error_lines(res)
    assert len(lines) == 1 and "train/loss did not fall over 5 epochs" in lines[0], res.err


def test_an_accelerator_that_claims_what_it_is_not_fails(monkeypatch):
    from rlinf_cli.accel import CPU
    from rlinf_cli.testing.accelerator import accelerator_checks

    class Liar(CPU):
        def dist_backend(self) -> str:
            return "nccl"  # declares gloo

    class NoDevice(CPU):
        def is_available(self) -> bool:
            return False

        def missing(self) -> str:
            return "pretend"

    for cls, name, message in ((Liar, "declared names", "dist_backend() returned 'nccl' but the class declares 'gloo'"),
                               (NoDevice, "unavailable", "supports_bf16() is true on a backend that is not available")):
        monkeypatch.setattr(sys.modules[__name__], cls.__name__, cls, raising=False)
        monkeypatch.setitem(get_registry()._specs["accelerator"], "liar",
                            Spec("accelerator", "liar", f"{__name__}:{cls.__name__}", "", False, "test", "0", None))
        failed = [r for r in accelerator_checks("liar") if not r.passed]
        assert failed and failed[0].name.startswith(name) and message in failed[0].detail, failed


def test_unknown_and_ambiguous_names(cli):
    res = cli("check-plugin", "pp0")
    assert res.code == 2 and res.err.strip() == res.err.strip().splitlines()[0]
    assert "unknown algorithm 'pp0'" in res.err and "Did you mean 'ppo'?" in res.err
    res = cli("check-plugin", "mlp", "--kind", "algorithm")
    assert res.code == 2 and "unknown algorithm 'mlp'" in res.err
    res = cli("check-plugin", "mlp", "--kind", "robot")
    assert res.code == 2 and "unknown plugin kind 'robot'" in res.err


def test_the_contract_modules_load_without_torch():
    """pytest loads rlinf's pytest11 plugin at the start of every run: it must stay light."""
    code = ("import sys, rlinf_cli.testing, rlinf_cli.testing.pytest_plugin, rlinf_cli.testing.command; "
            "print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


def test_the_pytest_plugin_is_registered_and_filters_by_name(workdir):
    from importlib.metadata import entry_points

    assert [e.value for e in entry_points(group="pytest11") if e.name == "rlinf"] == ["rlinf_cli.testing.pytest_plugin"]
    (workdir / "test_mine.py").write_text("def test_x(rlinf_model, rlinf_accelerator):\n    pass\n")
    out = subprocess.run([sys.executable, "-m", "pytest", "--co", "-q", "-p", "no:cacheprovider",
                          "--rlinf-plugin", "mlp", "--rlinf-plugin", "cpu", "test_mine.py"],
                         capture_output=True, text=True, cwd=workdir, timeout=120).stdout
    assert "test_mine.py::test_x[mlp-cpu]" in out and "1 test collected" in out, out


@pytest.mark.slow
def test_installed_scaffolds_pass_check_plugin_and_their_shipped_tests(cli_proc, workdir):
    """As a plugin author gets them: `rlinf plugins new`, `pip install`, `rlinf check-plugin`, `pytest tests/`."""
    made = []
    try:
        for name, kind in (("cp_inst_model", "model"), ("cp_inst_algo", "algorithm")):
            res = cli_proc("plugins", "new", name, "--kind", kind, "--dir", str(workdir))
            assert res.code == 0, res.err
            pkg = next(workdir.glob(f"rlinf-*-{name.replace('_', '-')}"))
            assert (pkg / "tests" / f"test_{name}_contract.py").is_file()
            subprocess.run([*PIP, "install", "--no-deps", "--no-build-isolation", str(pkg)], check=True, timeout=300)
            made.append(pkg.name)
            res = cli_proc("check-plugin", name)
            assert res.code == 0, res.out + res.err
            tests = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests"],
                                   capture_output=True, text=True, cwd=pkg, timeout=600)
            assert tests.returncode == 0 and "1 passed" in tests.stdout, tests.stdout + tests.stderr
    finally:
        if made:
            subprocess.run([*PIP, "uninstall", "-y", *made], check=True, timeout=300)
    res = cli_proc("check-plugin", "cp_inst_model")
    assert res.code == 2 and "unknown model 'cp_inst_model'" in res.err
