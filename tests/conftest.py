"""Shared fixtures: run the CLI in-process (fast) or as a subprocess (import checks)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

import rlinf_cli  # noqa: F401  first: sets MKL's reproducibility mode before any torch op

REPO = Path(__file__).resolve().parents[1]
# The tests live in subfolders (unit/, cli/, learning/, contracts/, sims/, models/; tests/README.md)
# and import the helpers beside this file by bare name (fake_sims, envserver, rich_tables, ...).
# pytest's default import mode puts this folder on sys.path when it loads this conftest; say so
# here too, so that the helpers resolve whatever the import mode.
if str(REPO / "tests") not in sys.path:
    sys.path.insert(0, str(REPO / "tests"))
RLINF = str(Path(sys.executable).with_name("rlinf"))

# Learning tests (marker `learning`) train with this seed; benchmarks/learning_margins.py runs them
# over several seeds and lesser-CPU settings (`make test-portable`'s variables) and reads what each
# measured from RLINF_LEARNING_LOG, to set and check their thresholds (docs/benchmarks.md).
LEARNING_SEED = int(os.environ.get("RLINF_LEARNING_SEED", "0"))


@dataclass
class Learning:
    """A learning test's seed, and where it reports the number its threshold is checked against."""

    nodeid: str
    seed: int = LEARNING_SEED

    def record(self, value: float, bar: float, **extra: float) -> None:
        """Report the measured ``value`` and the ``bar`` it must reach (value >= bar passes)."""
        path = os.environ.get("RLINF_LEARNING_LOG")
        if path:
            row = {"test": self.nodeid, "seed": self.seed, "cpu": os.environ.get("RLINF_CPU_CONFIG", "default"),
                   "value": float(value), "bar": float(bar),
                   **{k: float(v) for k, v in extra.items()}}
            with open(path, "a") as f:
                f.write(json.dumps(row) + "\n")


@pytest.fixture
def learning(request: pytest.FixtureRequest) -> Learning:
    return Learning(request.node.nodeid)

# The interrupt tests send SIGINT to an `rlinf` child as Ctrl-C would. A suite started in the
# background of a non-interactive shell (`make test &` in a script) has SIGINT ignored, and
# children inherit that: the signal never arrives and the child runs to its end with exit 0.
# Restore the default here so that every `rlinf` the tests start can be interrupted.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)
signal.pthread_sigmask(signal.SIG_UNBLOCK, [signal.SIGINT])


# Seconds the heaviest test files took in `make test` (2026-12-01, 2 workers, `--durations`).
# pytest-xdist (`--dist loadfile --no-loadscope-reorder`, Makefile) hands whole files to its
# workers in collection order; putting the longest first lets the two workers finish together
# instead of one running a 5-minute file alone at the end. Rough numbers are enough. Keyed by file
# name, whichever subfolder of tests/ the file is in.
HEAVY_FILES = {"test_vla_learning.py": 130, "test_release.py": 270, "test_faults.py": 195,
               "test_resume_exact.py": 165, "test_sac.py": 160, "test_rl_backends.py": 140,
               "test_normalize.py": 130, "test_executor_ray.py": 100, "test_bad_input_e2e.py": 95,
               "test_bf16.py": 90, "test_text_cli.py": 150, "test_vla_cli.py": 70, "test_robot.py": 70,
               "test_rl_best.py": 45, "test_fault_drills.py": 60, "test_ray_trainer_ranks.py": 420,
               "test_local_trainer_ranks.py": 120, "test_flow_learning.py": 90,
               "test_generation_workers.py": 200, "test_ray_head_loss.py": 60}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    items.sort(key=lambda item: -HEAVY_FILES.get(item.path.name, 0))  # stable: the rest keep their order


@dataclass
class Result:
    code: int
    out: str
    err: str

    def json_tail(self) -> dict:
        """The last JSON object printed on stdout (eval prints one)."""
        start = self.out.rfind("\n{")
        return json.loads(self.out[start + 1 if start >= 0 else self.out.index("{"):])


@pytest.fixture
def workdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A fresh working directory; runs and the MLflow store land under it."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("COLUMNS", "200")
    return tmp_path


@pytest.fixture
def cli(workdir: Path, capsys: pytest.CaptureFixture):
    """Call `rlinf ...` in this process; returns a Result (exit code, stdout, stderr)."""
    from rlinf_cli.cli import main

    def run(*args: str) -> Result:
        capsys.readouterr()
        try:
            main([str(a) for a in args])
            code = 0
        except SystemExit as exc:
            code = int(exc.code or 0)
        captured = capsys.readouterr()
        return Result(code, captured.out, captured.err)

    return run


@pytest.fixture
def cli_proc(workdir: Path):
    """Call `rlinf ...` as a subprocess (for exit codes, tracebacks and import checks)."""

    def run(*args: str, env: dict | None = None, timeout: float = 600) -> Result:
        proc = subprocess.run([RLINF, *map(str, args)], capture_output=True, text=True, timeout=timeout,
                              env={**os.environ, "COLUMNS": "200", **(env or {})})
        return Result(proc.returncode, proc.stdout, proc.stderr)

    return run


def run_main(*args: str) -> None:
    """`rlinf ...` in this process, asserting it exited 0: for module-scoped fixtures, where the
    function-scoped ``cli`` fixture cannot go."""
    from rlinf_cli.cli import main

    try:
        main([str(a) for a in args])
    except SystemExit as exc:
        assert not exc.code, f"rlinf {' '.join(map(str, args))} exited with {exc.code}"


def cartpole_clone(root: Path, sft_epochs: int) -> Path:
    """CartPole: 4 expert episodes in ``root/demos`` and a policy cloned from them by `rlinf sft`
    in ``root/sft`` (its rlinf.yaml names the dataset); returns the clone's best checkpoint."""
    quiet = ["progress=false", "tracking.enabled=false", f"runs_dir={root / 'runs'}"]
    run_main("collect", "policy=expert", "episodes=4", "num_envs=2", f"output={root / 'demos'}", *quiet)
    run_main("sft", f"dataset={root / 'demos'}", f"algo.epochs={sft_epochs}", "eval.episodes=0",
             f"run_dir={root / 'sft'}", *quiet)
    return root / "sft" / "checkpoints" / "best"


def wait_for_checkpoint(run_dir: Path, iteration: int, proc: subprocess.Popen | None = None,
                        timeout: float = 300.0, poll: float = 0.02) -> Path:
    """Wait until ``run_dir`` holds a periodic checkpoint of ``iteration`` or later; returns it.

    Waiting for one named checkpoint (``iter_000004``) raced: with ``checkpoint.keep=2`` and a tiny
    run at ~60 iterations/s, that directory lives for a few tens of milliseconds before the next
    ones replace it, and a poll can miss it (CI waited 180 s for it). A later one is as good a
    sign that the run got there. A test that reads that exact checkpoint sets ``checkpoint.keep``."""
    import time

    t0 = time.time()
    ckpts = Path(run_dir) / "checkpoints"
    while True:
        try:
            done = sorted(p for p in ckpts.iterdir() if p.name.startswith("iter_") and p.suffix != ".tmp"
                          and int(p.name[5:]) >= iteration)
        except (FileNotFoundError, ValueError):
            done = []
        if done:
            return done[0]
        if proc is not None and proc.poll() is not None:
            err = proc.stderr.read()[-3000:] if proc.stderr else ""
            raise AssertionError(f"the run ended ({proc.returncode}) before checkpoint {iteration}: {err}")
        if time.time() - t0 > timeout:
            raise AssertionError(f"no checkpoint {iteration} or later in {ckpts} after {timeout:.0f} s")
        time.sleep(poll)
