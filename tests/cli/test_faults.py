"""Bad input and faults through the real CLI: one clear line and exit code 2 (or recovery), no
traceback, nothing already written lost; concurrent runs that lose nothing."""

from __future__ import annotations

import hashlib
import json
import os
import resource
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from tests.conftest import RLINF, wait_for_checkpoint
from tests.cli.test_bad_input_e2e import _one_line_error

QUICK = ["tracking.enabled=false", "progress=false"]


@pytest.fixture
def open_dir(workdir):
    """A working directory outside pytest's own (the runs below drop root's privileges)."""
    d = Path(tempfile.mkdtemp(prefix="rlinf-faults-"))
    os.chdir(d)
    yield d
    os.chdir(workdir)
    subprocess.run(["rm", "-rf", str(d)], check=False)


def _as_user(cwd: Path, *args: str, limit_bytes: int | None = None, env: dict | None = None):
    """`rlinf args` bound by file permissions (root without the capabilities that let it ignore
    them), optionally with a file-size limit (`ulimit -f`)."""
    def pre() -> None:
        if limit_bytes is not None:
            resource.setrlimit(resource.RLIMIT_FSIZE, (limit_bytes, limit_bytes))
        if os.geteuid() == 0:  # drop CAP_DAC_OVERRIDE and CAP_DAC_READ_SEARCH for the exec'd program
            import ctypes

            libc = ctypes.CDLL(None, use_errno=True)
            for cap in (1, 2):
                if libc.prctl(24, cap, 0, 0, 0) != 0:  # PR_CAPBSET_DROP
                    raise OSError(ctypes.get_errno(), "prctl(PR_CAPBSET_DROP) failed")

    base = {**os.environ, "HOME": str(cwd), "MPLCONFIGDIR": str(cwd / ".mpl"), "COLUMNS": "200", **(env or {})}
    proc = subprocess.run([RLINF, *args], cwd=cwd, capture_output=True, text=True, timeout=300, env=base,
                          preexec_fn=pre)
    from tests.conftest import Result

    return Result(proc.returncode, proc.stdout, proc.stderr)


def _chmod_tree(path: Path, mode: int) -> None:
    for p in [path, *path.rglob("*")]:
        p.chmod(mode if p.is_dir() else mode & 0o666)


# -- 1. bad values ----------------------------------------------------------------------------
@pytest.mark.parametrize("args,needle", [
    (["collect", "episodes=-3"], "needs the setting 'output'"),
    (["collect", "episodes=-3", "output=data/x"], "'episodes': -3; it must be an integer >= 1"),
    (["rl", "num_envs=0"], "'num_envs': 0"),
    (["rl", "num_envs=-1"], "'num_envs': -1"),
    (["rl", "total_steps=0"], "'total_steps': 0"),
    (["rl", "total_steps=-5"], "'total_steps': -5"),
    (["rl", "train.threads=0"], "'train.threads': 0; it must be auto or an integer >= 1"),
    (["rl", "train.threads=many"], "it must be auto or an integer >= 1"),
    (["collect", "output=d", "epsilon=1.5"], "a probability in [0, 1]"),
    (["sft", "dataset=d", "val_fraction=1"], "a fraction in [0, 1)"),
    (["pipeline", "rl.total_steps=0"], "'total_steps': 0"),
    (["pipeline", "eval.seed=2000001"], "validation seeds 2,000,000..2,000,009 (eval.val_seed, eval.val_episodes) overlap"),
    (["rl", "eval.val_episodes=null", "eval.episodes=0"], "eval.best=true needs validation episodes"),
    (["pipeline", "sim=arithmetic"], "`rlinf pipeline` runs embodied simulators; for the text task 'arithmetic'"),
    # issue 31: values that passed the checks and then crashed, or ran
    (["rl", "algo.lr=nan"], "'algo.lr': nan; settings take finite numbers"),
    (["rl", "algo.lr=inf"], "'algo.lr': inf; settings take finite numbers"),
    (["sft", "dataset=d", "algo.weight_decay=-inf"], "'algo.weight_decay': -inf; settings take finite numbers"),
    (["rl", "seed=-1"], "'seed': -1; a seed is an integer from 0 to 4,294,967,295"),
    (["rl", "seed=99999999999999999999"], "'seed': 99999999999999999999; a seed is an integer from 0"),
    (["eval", "checkpoint=random", "seed=4294967296"], "'seed': 4294967296; a seed is an integer"),
    (["rl", "eval.val_seed=-5"], "'eval.val_seed': -5"),
    (["collect", "output=" + "x" * 300], "cannot be a path: a name in it is 300 bytes long (at most 255)"),
    (["rl", "run_dir=" + "/d" * 3000], "cannot be a path: it is 6,000 bytes long (at most 4096)"),
    (["rl", "tracking.run_name=" + "r" * 251], "'tracking.run_name'"),
    (["rl", "num_envs=100000", "total_steps=2000"], "num_envs=100,000 is more envs than total_steps=2,000 has steps"),
    (["pipeline", "rl.algo.lr=nan"], "'algo.lr': nan"),
])
def test_out_of_range_values_fail_at_once_and_write_nothing(workdir, args, needle):
    # refused before any simulator, model or tracking store was built: none of them was even
    # imported (a check of what ran rather than of wall time, which a busy machine stretches)
    probe = ("import json, sys\nfrom rlinf_cli.cli import main\ntry:\n    main(sys.argv[1:])\nexcept SystemExit as e:\n"
             "    heavy = [m for m in ('gymnasium', 'metaworld', 'mlflow', 'transformers') if m in sys.modules]\n"
             "    print(json.dumps(heavy))\n    raise")
    proc = subprocess.run([sys.executable, "-c", probe, *args], capture_output=True, text=True, timeout=300, cwd=workdir)
    from tests.conftest import Result

    _one_line_error(Result(proc.returncode, proc.stdout, proc.stderr), needle)
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == [], "work was started before the check"
    assert not [p for p in workdir.iterdir() if not p.name.startswith(".")], "a rejected run left files behind"


# -- 2. permissions, read-only stores, disk limits --------------------------------------------
def test_read_only_runs_dir_and_output_dir(open_dir):
    (open_dir / "runs").mkdir()
    (open_dir / "data").mkdir()
    _chmod_tree(open_dir / "runs", 0o555)
    _chmod_tree(open_dir / "data", 0o555)
    res = _as_user(open_dir, "rl", "runs_dir=runs", "total_steps=64", *QUICK)
    _one_line_error(res, "cannot create the run directory")
    assert "runs_dir" in res.err
    res = _as_user(open_dir, "collect", "output=data/demos", "episodes=2", *QUICK)
    _one_line_error(res, "cannot create the dataset directory 'data/demos'")
    assert list((open_dir / "runs").iterdir()) == [] and list((open_dir / "data").iterdir()) == []


def test_read_only_mlflow_store_is_one_line_and_leaves_no_run_dir(open_dir):
    res = _as_user(open_dir, "rl", "total_steps=64", "progress=false", "eval.episodes=0")
    assert res.code == 0, res.err  # creates rlinf_runs/mlflow.db
    runs = sorted((open_dir / "rlinf_runs/rl").iterdir())
    (open_dir / "rlinf_runs/mlflow.db").chmod(0o444)
    res = _as_user(open_dir, "rl", "total_steps=64", "progress=false", "eval.episodes=0")
    _one_line_error(res, "is read-only")
    assert sorted((open_dir / "rlinf_runs/rl").iterdir()) == runs  # no empty run directory left behind


def test_file_size_limit_during_collect_keeps_the_dataset_whole(open_dir):
    """`ulimit -f`: the chunk that does not fit is one line; meta.json still describes exactly the
    chunks on disk, with no provenance for episodes never written."""
    args = ["collect", "sim.env_id=HalfCheetah-v5", "policy=random", "output=demo", *QUICK]
    res = _as_user(open_dir, *args, "episodes=2", "chunk_episodes=2")
    assert res.code == 0, res.err
    before = json.loads((open_dir / "demo/meta.json").read_text())
    res = _as_user(open_dir, *args, "episodes=6", "chunk_episodes=6", limit_bytes=200 * 1024)
    _one_line_error(res, "cannot write to dataset 'demo'")
    assert "file-size limit" in res.err and "keeps its 2 complete episodes" in res.err
    after = json.loads((open_dir / "demo/meta.json").read_text())
    assert after == before
    assert sorted(p.name for p in (open_dir / "demo").iterdir() if not p.name.startswith(".")) == \
        sorted(["meta.json", *(c["file"] for c in before["chunks"])])
    from rlinf_cli.data import dataset as ds

    assert ds.load(open_dir / "demo").num_episodes == 2
    # with tracking on, the store itself cannot be created under the limit: one line as well
    res = _as_user(open_dir, *args[:-2], "episodes=2", "runs_dir=fresh", "progress=false", limit_bytes=64 * 1024)
    _one_line_error(res, "disk is full or a file-size limit")
    assert not (open_dir / "fresh/mlflow.db").exists()  # no half-built store that every later run would trip over
    assert json.loads((open_dir / "demo/meta.json").read_text()) == before


def test_collect_interrupted_says_what_was_saved(workdir):
    proc = subprocess.Popen([RLINF, "collect", "episodes=400", "chunk_episodes=1", "num_envs=1", "output=demo",
                             "sim.env_id=HalfCheetah-v5", "policy=random", *QUICK],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    t0 = time.time()
    while not (workdir / "demo/meta.json").exists():
        assert time.time() - t0 < 120 and proc.poll() is None
        time.sleep(0.1)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130 and "Traceback" not in err
    meta = json.loads((workdir / "demo/meta.json").read_text())
    assert f"stopped by SIGINT: {meta['episodes']} episodes were added to demo" in err
    from rlinf_cli.data import dataset as ds

    assert 1 <= ds.load(workdir / "demo").num_episodes == meta["episodes"] < 400


# -- 3. concurrency ------------------------------------------------------------------------------
def _start(args: list[str], cwd: Path) -> subprocess.Popen:
    return subprocess.Popen([RLINF, *args], cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _history_equals_metrics(client, run_id: str, run_dir: Path) -> None:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    want: dict[str, list] = {}
    for row in rows:
        for k, v in row.items():
            if k != "step":
                want.setdefault(k, []).append((row["step"], v))
    have = {k: sorted((m.step, m.value) for m in client.get_metric_history(run_id, k))
            for k in client.get_run(run_id).data.metrics}
    assert have == {k: sorted(v) for k, v in want.items()}


def test_three_rl_runs_started_together_in_a_fresh_directory(workdir):
    procs = [_start(["rl", "total_steps=512", "num_envs=2", "algo.rollout_steps=64", "eval.episodes=1",
                     "progress=false"], workdir) for _ in range(3)]
    outs = [p.communicate(timeout=300) for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0], [o[1][-2000:] for o in outs]
    runs = sorted((workdir / "rlinf_runs/rl").iterdir())
    assert len(runs) == 3  # distinct run directories
    from mlflow.tracking import MlflowClient

    from rlinf_cli.tracking import default_uri

    client = MlflowClient(default_uri(workdir / "rlinf_runs"))  # the store is healthy
    for run in runs:
        rows = (run / "metrics.jsonl").read_text().splitlines()
        assert len(rows) == 1 + 512 // (2 * 64) + 1  # the start's validation, each iteration once, the final eval
        result = json.loads((run / "result.json").read_text())
        _history_equals_metrics(client, result["mlflow_run_id"], run)
    assert len(client.search_runs([client.get_experiment_by_name("rlinf").experiment_id])) == 3


def _episode_digests(path: Path) -> list[str]:
    from rlinf_cli.data import dataset as ds

    data = ds.load(path)
    out = []
    for e in sorted(set(data.episode.tolist())):
        rows = data.episode == e
        out.append(hashlib.sha256(b"".join(v[rows].tobytes() for v in data.obs.values())
                                  + data.actions[rows].tobytes()).hexdigest())
    return out


def test_two_collects_into_one_dataset_lose_and_duplicate_nothing(workdir):
    args = ["collect", "sim.env_id=CartPole-v1", "policy=random", "episodes=60", "chunk_episodes=5", "num_envs=2",
            "output=data/x", *QUICK]
    procs = [_start(args, workdir) for _ in range(2)]
    outs = [p.communicate(timeout=300) for p in procs]
    codes = sorted(p.returncode for p in procs)
    assert codes in ([0, 0], [0, 2]), outs
    if codes == [0, 2]:  # the second writer was refused while the first ran
        err = next(o[1] for p, o in zip(procs, outs) if p.returncode == 2)
        assert "is being written by another rlinf collect" in err and "Traceback" not in err
    meta = json.loads((workdir / "data/x/meta.json").read_text())
    assert meta["episodes"] == 60 * codes.count(0)
    digests = _episode_digests(workdir / "data/x")
    assert len(digests) == len(set(digests)) == meta["episodes"]


def test_rerunning_an_only_success_collect_stores_no_episode_twice(cli_proc, workdir):
    args = ["collect", "sim=metaworld", "sim.task=reach-v3", "sim.max_episode_steps=45", "policy=expert",
            "only_success=true", "episodes=6", "output=demos", *QUICK]
    for _ in range(2):
        res = cli_proc(*args)
        assert res.code == 0, res.err
    digests = _episode_digests(workdir / "demos")
    assert len(digests) == 12 and len(set(digests)) == 12
    meta = json.loads((workdir / "demos/meta.json").read_text())
    assert [p["episodes"] for p in meta["provenance"]] == [6, 6]
    assert meta["provenance"][1]["first_seed"] >= meta["provenance"][0]["first_seed"] + 6


def test_a_second_process_on_the_same_run_directory_is_refused(workdir):
    proc = _start(["rl", "total_steps=200000", "run_dir=shared", "progress=false", *QUICK[:1]], workdir)
    try:
        t0 = time.time()
        while not (workdir / "shared/rlinf.yaml").exists():
            assert time.time() - t0 < 120 and proc.poll() is None
            time.sleep(0.1)
        from tests.conftest import Result

        res = subprocess.run([RLINF, "rl", "total_steps=64", "run_dir=shared", *QUICK], cwd=workdir,
                             capture_output=True, text=True, timeout=300)
        _one_line_error(Result(res.returncode, res.stdout, res.stderr), "already holds a run")
    finally:
        proc.kill()
        proc.communicate()


# -- 4. tracking after kill -9 and resume --------------------------------------------------------
@pytest.mark.parametrize("flush_s", [0, 1000])  # every point already sent / none sent before the kill
def test_mlflow_history_equals_metrics_after_kill_and_resume(workdir, flush_s):
    from mlflow.tracking import MlflowClient

    from rlinf_cli.tracking import default_uri

    args = ["rl", "total_steps=40000", "num_envs=2", "algo.rollout_steps=32", "checkpoint.interval=3", "run_dir=run",
            "progress=false", "eval.episodes=1", f"tracking.flush_s={flush_s}"]
    proc = _start(args, workdir)
    t0 = time.time()
    wait_for_checkpoint(workdir / "run", 12, proc, timeout=300 - (time.time() - t0))
    time.sleep(0.3)  # a few iterations past the checkpoint
    proc.kill()
    proc.communicate()
    last = sorted(p for p in (workdir / "run/checkpoints").iterdir() if p.name.startswith("iter_"))[-1]
    state = json.loads((last / "trainer_state.json").read_text())
    res = subprocess.run([RLINF, "rl", f"resume={last}", f"total_steps={state['env_steps'] + 640}"], cwd=workdir,
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    result = json.loads((workdir / "run/result.json").read_text())
    client = MlflowClient(default_uri(workdir / "rlinf_runs"))
    _history_equals_metrics(client, result["mlflow_run_id"], workdir / "run")
    if result["mlflow_run_id"] != state["mlflow_run_id"]:  # rebuilt: the old run is deleted, the note says so
        assert client.get_run(state["mlflow_run_id"]).info.lifecycle_stage == "deleted"
        assert "rebuilt from metrics.jsonl" in res.stderr
    assert flush_s == 0 or result["mlflow_run_id"] == state["mlflow_run_id"]  # nothing extra: same run


# -- 5. rlinf ui -----------------------------------------------------------------------------
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _group_of_child(pid: int) -> int | None:
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:  # ppid
            return int(fields[2])  # pgrp
    return None


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
        return True
    except ProcessLookupError:
        return False


@pytest.mark.parametrize("how", [signal.SIGTERM, signal.SIGKILL])
def test_ui_takes_its_server_down_with_it_and_refuses_a_busy_port(cli_proc, workdir, how):
    assert cli_proc("rl", "total_steps=64", "progress=false", "eval.episodes=0").code == 0
    port = _free_port()
    proc = subprocess.Popen([RLINF, "ui", "--port", str(port)], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        t0 = time.time()
        while (group := _group_of_child(proc.pid)) is None or group == os.getpgrp():
            assert time.time() - t0 < 60 and proc.poll() is None
            time.sleep(0.1)
        with socket.socket() as s:  # a port held by someone else: one line, exit 2
            s.bind(("127.0.0.1", 0))
            _one_line_error(cli_proc("ui", "--port", str(s.getsockname()[1])), "is in use")
        time.sleep(2)  # the server starts its workers
        proc.send_signal(how)
        proc.wait(timeout=60)
        t0 = time.time()
        while _group_alive(group) and time.time() - t0 < 30:
            time.sleep(0.2)
        assert not _group_alive(group), "MLflow server processes outlived `rlinf ui`"
    finally:
        proc.kill()
        proc.communicate()


# -- 6. plugin authors ---------------------------------------------------------------------------
def test_installed_but_broken_plugin_is_named_with_its_import_error(workdir):
    from tests.plugin_fixtures import plugin_env

    env = plugin_env(workdir / "site")
    res = subprocess.run([RLINF, "rl", "sim=brokenthing", *QUICK], capture_output=True, text=True, env=env, timeout=120)
    lines = [line for line in res.stderr.splitlines() if line.startswith("error:")]
    assert res.returncode == 2 and len(lines) == 1 and "Traceback" not in res.stderr, res.stderr
    assert "rlinf-sim-brokenthing 0.1.0 is installed but broken" in lines[0]
    assert "No module named 'a_dependency_that_is_not_installed'" in lines[0]


def test_algorithm_missing_a_core_config_key_and_config_show_algo(workdir):
    from tests.plugin_fixtures import plugin_env

    env = plugin_env(workdir / "site")
    res = subprocess.run([RLINF, "rl", "--algo", "a2c_bad", *QUICK], capture_output=True, text=True, env=env, timeout=120)
    assert res.returncode == 2 and "Traceback" not in res.stderr, res.stderr
    assert "lacks 'anneal_lr', 'epochs', 'minibatch_size', 'max_grad_norm', 'weight_decay', 'rollout_steps'" in res.stderr
    res = subprocess.run([RLINF, "config", "show", "rl", "--algo", "a2c_bad"], capture_output=True, text=True, env=env,
                         timeout=120)
    assert res.returncode == 0 and "name: a2c_bad" in res.stdout, res.stderr
    res = subprocess.run([RLINF, "config", "show", "collect", "--algo", "ppo"], capture_output=True, text=True,
                         env=env, timeout=120)
    assert res.returncode == 2 and "'algo' is not used by `rlinf collect`" in res.stderr


@pytest.mark.parametrize("kind,must", [("simulator", "rlinf check-sim sim=demo_y"), ("model", "model=demo_y"),
                                        ("algorithm", "--algo demo_y")])
def test_each_scaffold_readme_is_about_its_own_kind(workdir, kind, must):
    from rlinf_cli.scaffold import new_plugin

    text = (new_plugin("demo_y", kind, workdir) / "README.md").read_text()
    assert must in text and f"rlinf {kind} plugin" in text
    assert "sim=demo_y" not in text or kind == "simulator"
