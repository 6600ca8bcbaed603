"""Issue 31's fault drills: what an outside tester broke with hostile commands, each now one clear
line (exit 2) or a clean recovery, leaving nothing a later run trips over. Stops by signal: one
line for every stage, exit code 130 (SIGINT) / 143 (SIGTERM), MLflow runs ended as KILLED."""

from __future__ import annotations

import errno
import json
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import RLINF, wait_for_checkpoint
from tests.cli.test_bad_input_e2e import _one_line_error

QUICK = ["tracking.enabled=false", "progress=false"]
TINY_RL = ["num_envs=2", "algo.rollout_steps=16", "algo.epochs=1", "eval.episodes=0", "progress=false"]


def _ends_with_one_error(res, needle: str) -> None:
    """A run that started (its notes came first) and then failed: exit 2, its last line the error."""
    assert res.code == 2, (res.code, res.err)
    errors = [line for line in res.err.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and needle in errors[0] and res.err.rstrip().endswith(errors[0]), res.err
    assert "Traceback" not in res.err


def _client(runs: Path):
    from mlflow.tracking import MlflowClient

    from rlinf_cli.tracking import default_uri

    return MlflowClient(default_uri(runs))


def _wait_for(path: Path, proc: subprocess.Popen, timeout: float = 180.0) -> None:
    t0 = time.time()
    while not path.exists():
        if proc.poll() is not None:
            raise AssertionError(f"the run ended ({proc.returncode}) before {path} appeared: {proc.stderr.read()[-3000:]}")
        if time.time() - t0 > timeout:
            raise AssertionError(f"{path} never appeared")
        time.sleep(0.05)


# -- 1. the first MLflow store of a directory, on a full disk -------------------------------------
def test_a_store_whose_creation_fails_leaves_nothing_and_the_next_run_works(cli, workdir, monkeypatch):
    """No cached empty store: MLflow's migrations run, and the disk fills half-way. The half-built
    store used to stay as mlflow.db, and every later run failed on it."""
    import mlflow.store.db.utils as db_utils

    monkeypatch.setenv("RLINF_CACHE_DIR", str(workdir / "cache"))
    real = db_utils._upgrade_db

    def full_disk(engine):  # the first tables exist by now (MLflow creates them before migrating)
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(db_utils, "_upgrade_db", full_disk)
    _one_line_error(cli("rl", "total_steps=32", *TINY_RL), "the disk is full")
    runs = workdir / "rlinf_runs"
    assert not [p.name for p in runs.iterdir() if "mlflow.db" in p.name and not p.name.endswith(".lock")]
    assert not any((runs / "rl").iterdir())  # no run directory either

    monkeypatch.setattr(db_utils, "_upgrade_db", real)  # space is back
    res = cli("rl", "total_steps=32", *TINY_RL)
    assert res.code == 0, res.err
    run_dir = next((runs / "rl").iterdir())
    run_id = json.loads((run_dir / "result.json").read_text())["mlflow_run_id"]
    assert _client(runs).get_run(run_id).info.status == "FINISHED"
    assert (workdir / "cache").is_dir() and any((workdir / "cache").iterdir())  # the empty store is cached now


def test_a_store_an_older_rlinf_left_half_built_gets_the_recovery_hint():
    from sqlalchemy.exc import OperationalError

    from rlinf_cli.tracking_store import store_error

    line = store_error("sqlite:////x/mlflow.db", OperationalError("CREATE TABLE trace_info", {},
                                                                   Exception("table trace_info already exists")))
    assert "schema is incomplete" in line and "mv mlflow.db mlflow.db.bad" in line


# -- 2. two `rlinf ui` on one port -------------------------------------------------------------------
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def store(workdir) -> Path:
    from rlinf_cli.tracking import default_uri
    from rlinf_cli.tracking_store import new_client

    db = workdir / "rlinf_runs" / "mlflow.db"
    db.parent.mkdir()
    new_client(default_uri(db.parent), db)
    return db


def test_a_second_ui_on_the_same_port_says_so_and_exits(workdir, store):
    port = _free_port()
    first = subprocess.Popen([RLINF, "ui", "--port", str(port)], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        # the first has checked the port and is starting its server, which binds it seconds later
        assert first.stdout.readline().startswith(b"MLflow UI for ")
        second = subprocess.run([RLINF, "ui", "--port", str(port)], capture_output=True, text=True, timeout=120)
        from tests.conftest import Result

        _one_line_error(Result(second.returncode, second.stdout, second.stderr), f"port {port} on 127.0.0.1 is in use")
        assert first.poll() is None  # the first one serves on
    finally:
        first.terminate()
        first.communicate(timeout=60)


def test_a_server_that_finds_its_port_taken_is_ended(workdir, store, monkeypatch):
    """A port taken after the check (not by an `rlinf ui`): MLflow's server fails to bind it; the
    command ends with the one line instead of a server restarting its workers forever."""
    from rlinf_cli import ui
    from rlinf_cli.errors import UserError

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        monkeypatch.setattr(ui, "port_free", lambda host, port: True)  # taken just after the check
        with pytest.raises(UserError, match=f"port {port} on 127.0.0.1 is in use"):
            ui.serve(f"sqlite:///{store}", port)


# -- 3, 7, 8. values that passed validation and then crashed ------------------------------------------
BIG = "a" * 100_000


@pytest.mark.parametrize("args,needle", [
    (["rl", f"total_steps={BIG}"], "got 'aaaaaaaaa"),
    (["rl", f"sim={BIG}"], "unknown simulator 'aaaaaaaaa"),
    (["rl", f"{BIG}=1"], "unknown config key 'aaaaaaaaa"),
    (["rl", f"tracking.run_name={BIG}"], "MLflow takes at most 250"),
    (["collect", f"output={BIG}"], "cannot be a path: a name in it is 100,000 bytes long (at most 255)"),
])
def test_a_huge_bad_value_is_not_echoed_whole(cli, workdir, args, needle):
    res = cli(*args)
    _one_line_error(res, needle)
    assert "(100,002 characters)" in res.err and len(res.err) < 600


def test_the_cli_cuts_any_over_long_word_of_an_error_line():
    from rlinf_cli.errors import error_line

    assert error_line(f"bad thing {'x' * 5000} here") == f"bad thing {'x' * 60}... (5,000 characters) here"
    assert error_line(f"in {'/d' * 100}: gone") == f"in {'/d' * 100}: gone"  # a long path stays whole


def test_a_duration_takes_a_fraction_of_a_second(cli):
    res = cli("config", "show", "rl", "tracking.flush_s=0.5", "runtime.worker_timeout_s=2.5")
    assert res.code == 0, res.err
    assert "flush_s: 0.5" in res.out and "worker_timeout_s: 2.5" in res.out
    _one_line_error(cli("rl", "total_steps=0.5"), "expected an integer")  # a count is still whole


@pytest.mark.parametrize("name", ["/tmp/x.yaml", "./mine.yaml", "conf/sim.yml"])
def test_a_path_given_as_a_plugin_option_is_called_a_path(cli, name):
    res = cli("rl", f"sim={name}")
    _one_line_error(res, f"sim= takes the name of a simulator, not a file: '{name}' looks like a path")
    assert "gymnasium" in res.err and "pip install" not in res.err


def test_an_invalid_host_is_called_an_invalid_address(cli):
    _one_line_error(cli("env", "serve", "sim=gymnasium", "host=999.1.1.1"),
                    "host='999.1.1.1' is neither an IP address nor a host name")


def test_startup_work_says_what_it_does(cli, workdir, monkeypatch):
    from rlinf_cli import progress

    monkeypatch.setattr(progress, "SLOW_S", 0.0)  # as if making the envs took long
    res = cli("rl", "total_steps=32", "tracking.enabled=false", *TINY_RL[:-1], "progress=true")
    assert res.code == 0, res.err
    assert "starting 2 envs ..." in res.err
    quiet = cli("rl", "total_steps=32", *TINY_RL, "tracking.enabled=false")  # progress=false: nothing
    assert quiet.code == 0 and "starting" not in quiet.err


# -- 4. a checkpoint that does not fit on the disk --------------------------------------------------
# `rlinf rl` in a process whose torch.save hits a full disk when it writes the second checkpoint's
# optimizer state: as an OSError, or as torch's zip writer reports one (a RuntimeError)
FULL_DISK_RUN = """
import errno, sys, torch
real = torch.save
def save(obj, f, *a, **k):
    if ".iter_000002.tmp" in str(f):
        if sys.argv[1] == "oserror":
            raise OSError(errno.ENOSPC, "No space left on device")
        raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 8768 vs 8656")
    return real(obj, f, *a, **k)
torch.save = save
from rlinf_cli.cli import main
main(sys.argv[2:])
"""


@pytest.mark.parametrize("failure", ["oserror", "torch"])
def test_a_checkpoint_the_disk_cannot_hold_is_removed_and_the_run_says_how_to_resume(workdir, failure):
    from tests.conftest import Result

    args = ["rl", "total_steps=320", "checkpoint.interval=1", "run_dir=run", *TINY_RL, "tracking.enabled=false"]
    proc = subprocess.run([sys.executable, "-c", FULL_DISK_RUN, failure, *args], capture_output=True, text=True,
                          timeout=300)
    res = Result(proc.returncode, proc.stdout, proc.stderr)
    _ends_with_one_error(res, "cannot write checkpoint run/checkpoints/iter_000002")
    assert "disk is full" in res.err and "the checkpoints written before are intact" in res.err
    assert "resume with: rlinf rl resume=run/checkpoints/iter_000001" in res.err
    # no .tmp left (best: the starting policy, kept by eval.best before the first update)
    assert sorted(p.name for p in (workdir / "run/checkpoints").iterdir()) == ["best", "iter_000001"]
    if failure == "oserror":  # and the advice works once there is space again
        res = subprocess.run([RLINF, "rl", "resume=run/checkpoints/iter_000001", "total_steps=64",
                              "tracking.enabled=false"], capture_output=True, text=True, timeout=300)
        assert res.returncode == 0, res.stderr
        assert json.loads((workdir / "run/checkpoints/final/trainer_state.json").read_text())["iteration"] == 2


# -- 5. signals and MLflow ------------------------------------------------------------------------------
def test_mlflow_holds_every_point_up_to_the_last_checkpoint_after_kill_9(workdir):
    """tracking.flush_s is long, yet each checkpoint sends the points before it once it is on disk
    (iter_000006 on disk: iter_000004's flush has ended); a later run in the same store marks the
    killed run KILLED (it was left RUNNING)."""
    proc = subprocess.Popen([RLINF, "rl", "total_steps=1000000", "checkpoint.interval=2", "checkpoint.keep=100000",
                             "run_dir=run", "tracking.flush_s=100000", *TINY_RL], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    wait_for_checkpoint(workdir / "run", 6, proc)  # iter_000004 (kept: keep=100000) is read below
    proc.kill()
    proc.communicate()
    state = json.loads((workdir / "run/checkpoints/iter_000004/trainer_state.json").read_text())
    client = _client(workdir / "rlinf_runs")
    run_id = state["mlflow_run_id"]
    rows = [json.loads(line) for line in (workdir / "run/metrics.jsonl").read_text().splitlines() if line.strip()]
    want = sorted((r["step"], r["train/policy_loss"]) for r in rows
                  if r["step"] <= state["env_steps"] and "train/policy_loss" in r)  # not the start's validation
    have = sorted((m.step, m.value) for m in client.get_metric_history(run_id, "train/policy_loss"))
    assert len(want) == 4 and have[:4] == want  # (the flush at iter_000004 may be followed by none or more)
    assert client.get_run(run_id).info.status == "RUNNING"  # nothing could end it

    res = subprocess.run([RLINF, "eval", "checkpoint=random", "episodes=1", "progress=false"], capture_output=True,
                         text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    assert f"marked KILLED the MLflow run {run_id} that a process left RUNNING when it died" in res.stderr
    run = client.get_run(run_id)
    assert run.info.status == "KILLED" and run.data.tags["rlinf.ended"].startswith("marked KILLED by a later run")


def test_a_live_run_is_never_marked_killed(workdir):
    from rlinf_cli.locks import FileLock, abandoned

    lock = FileLock(workdir / ".lock").acquire()
    try:
        assert not abandoned(workdir / ".lock")  # held by this live process
    finally:
        lock.release()
    (workdir / ".lock").write_text("999999999")  # a pid no process has, and nobody holds the lock
    assert abandoned(workdir / ".lock")
    assert not abandoned(workdir / "missing.lock")


def _demos(workdir: Path) -> Path:
    res = subprocess.run([RLINF, "collect", "policy=expert", "episodes=4", "output=demos", *QUICK],
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    return workdir / "demos"


# (stage, signal, arguments, the file that says it is running, what the line says it kept)
STOPS = [
    ("rl", signal.SIGTERM, ["total_steps=1000000", "checkpoint.interval=2", *TINY_RL],
     "run/checkpoints/iter_000002", "the last checkpoint is run/checkpoints/iter_0000"),
    ("sft", signal.SIGINT, ["dataset=demos", "algo.epochs=100000", "eval.episodes=0", "progress=false"],
     "run/checkpoints/best/config.json", "the best checkpoint so far is run/checkpoints/best; `rlinf sft` does not resume"),
    ("collect", signal.SIGTERM, ["policy=random", "episodes=100000", "chunk_episodes=1", "num_envs=1", "output=more",
                                 "progress=false"],
     "more/meta.json", "episodes were added to more"),
    ("eval", signal.SIGINT, ["checkpoint=random", "episodes=1000000", "num_envs=2", "progress=false"],
     "run/metrics.jsonl", "no result was written (an evaluation does not resume"),
    ("pipeline", signal.SIGTERM, ["collect.episodes=2", "sft.algo.epochs=1", "rl.total_steps=1000000",
                                  "rl.num_envs=2", "rl.algo.rollout_steps=16", "rl.algo.epochs=1", "rl.checkpoint.interval=100000",
                                  "progress=false"],
     "rl/metrics.jsonl", "in step rl: no checkpoint yet"),
]


@pytest.mark.parametrize("stage,sig,args,marker,saved", STOPS, ids=[f"{s[0]}-{s[1].name}" for s in STOPS])
def test_every_stage_stops_the_same_way_on_sigint_and_sigterm(workdir, stage, sig, args, marker, saved):
    if stage == "sft":
        _demos(workdir)
    run_dir = [] if stage == "pipeline" else ["run_dir=run"]
    proc = subprocess.Popen([RLINF, stage, *args, *run_dir], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if stage == "pipeline":
        while not list((workdir / "rlinf_runs").glob(f"pipeline/*/{marker}")):
            assert proc.poll() is None, proc.stderr.read()[-3000:]
            time.sleep(0.05)
    elif stage == "rl":  # a periodic checkpoint is replaced within milliseconds: wait for it or a later one
        wait_for_checkpoint(workdir / "run", int(marker.rsplit("_", 1)[1]), proc)
    else:
        _wait_for(workdir / marker, proc)
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 128 + sig, (proc.returncode, err[-3000:])
    assert "Traceback" not in err
    lines = [line for line in err.splitlines() if line.startswith("stopped")]
    assert len(lines) == 1 and lines[0].startswith(f"stopped by {sig.name}: ") and saved in lines[0], err[-3000:]
    assert err.rstrip().endswith(lines[0])  # the last thing said
    if stage == "rl":  # the resume command names a checkpoint that exists
        resume = lines[0].split("resume with: rlinf rl resume=")[1]
        assert (workdir / resume / "trainer_state.json").is_file()
    if stage == "pipeline":
        assert "the pipeline does not resume: the finished steps' outputs are in rlinf_runs/pipeline/" in lines[0]
    client = _client(workdir / "rlinf_runs")
    runs = client.search_runs([client.get_experiment_by_name("rlinf").experiment_id],
                              order_by=["attributes.start_time DESC"])
    assert runs[0].info.status == "KILLED"  # the stopped stage's run; none is left RUNNING
    assert all(r.info.status != "RUNNING" for r in runs)


# -- 6. a checkpoint file that needs pickle ---------------------------------------------------------
class NotATensor:
    """Any object that only pickle can rebuild."""


def test_a_pickled_optimizer_file_is_refused_without_advising_pickle(cli, workdir):
    import torch

    res = cli("rl", "total_steps=32", "run_dir=run", *TINY_RL, "tracking.enabled=false")
    assert res.code == 0, res.err
    ckpt = workdir / "run/checkpoints/final"
    torch.save({"state": {}, "param_groups": [], "extra": NotATensor()}, ckpt / "optimizer.pt")
    res = cli("rl", f"resume={ckpt}", "total_steps=64", "tracking.enabled=false")
    _ends_with_one_error(res, "optimizer.pt holds Python objects that only pickle can load")
    assert "safetensors" in res.err and f"init={ckpt}" in res.err
    assert "weights_only" not in res.err and "can still be loaded" not in res.err
