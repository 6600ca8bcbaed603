"""Generation workers (placement.generation.workers): the text rollout's sampling in worker processes.

max_staleness=0 with 1 and 2 workers writes the in-process run's metrics and final weights bit for
bit (2 workers: the batch really split, rollout/runtime/generation_parts); a worker killed with -9 is
restarted and its request sent again, so the run still equals the in-process one; max_staleness=1
samples one version behind, resumes; bad values are one line.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from generation_runs import GRPO, QUIET, RLINF, TINY, assert_same_run, column, rows, splits


@pytest.fixture(scope="module")
def in_process(tmp_path_factory) -> Path:
    """The reference: the same GRPO run sampling in the trainer (placement.generation.workers=0)."""
    where = tmp_path_factory.mktemp("in_process")
    proc = subprocess.run([RLINF, "rl", *GRPO, "run_dir=ref"], cwd=where, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return where / "ref"


@pytest.mark.parametrize("workers", [1, 2])
def test_synchronous_workers_equal_sampling_in_the_trainer(cli, workdir, in_process, workers):
    r = cli("rl", *GRPO, f"placement.generation.workers={workers}", "run_dir=gen")
    assert r.code == 0, r.err
    assert f"sampling: {workers} generation worker(s), executor=local" in r.err + r.out
    assert_same_run(in_process, workdir / "gen")
    # split over both (every batch of this seed has prompts of several lengths), unless this machine's
    # kernels give a part other bits (MKL_CBWR=COMPATIBLE): then the run says so and does not split
    parts = workers if splits(r.err) else 1
    assert column(workdir / "gen", "rollout/runtime/generation_parts") == [float(parts)] * 3
    assert column(workdir / "gen", "rollout/weight_version_lag") == [0.0] * 3
    assert len(column(workdir / "gen", "time/weight_sync_s")) == 3
    assert column(workdir / "gen", "time/generation_overlap_s") == [0.0] * 3  # synchronous: nothing overlaps
    assert all(b > 0 for b in column(workdir / "gen", "time/generation_busy_s"))


def test_lora_workers_receive_the_adapter_and_equal_the_trainer(cli, workdir):
    lora = [*GRPO, "model.lora.r=4"]
    for run, extra in (("ref", []), ("gen", ["placement.generation.workers=2"])):
        r = cli("rl", *lora, f"run_dir={run}", *extra)
        assert r.code == 0, r.err
    assert_same_run(workdir / "ref", workdir / "gen", "model.safetensors")  # the adapter's weights


def test_ppo_values_recorded_by_workers_equal_the_trainers(cli, workdir):
    """PPO's steps rollout with a value head: the old values come from the workers' critic."""
    ppo = ["--algo", "ppo", "sim=arithmetic", "sim.digits=2", "sim.format_reward=0.5", *TINY, "text.iterations=2",
           "algo.rollout_steps=2", "num_envs=5", "algo.minibatch_size=5", "algo.epochs=1", "algo.gamma=1.0",
           "eval.episodes=2", *QUIET]
    for run, extra in (("ref", []), ("gen", ["placement.generation.workers=2"])):
        r = cli("rl", *ppo, f"run_dir={run}", *extra)
        assert r.code == 0, r.err
    assert column(workdir / "gen", "rollout/runtime/generation_parts") == [2.0 if splits(r.err) else 1.0] * 2
    assert_same_run(workdir / "ref", workdir / "gen", "value_head.safetensors")
    assert_same_run(workdir / "ref", workdir / "gen")


def _generation_workers(pid: int) -> list:
    """The generation-worker processes under an `rlinf` process (forkserver's children)."""
    import psutil

    out = []
    for p in psutil.Process(pid).children(recursive=True):
        try:
            parent = p.parent()
            if parent is not None and "forkserver" in " ".join(parent.cmdline()):
                out.append(p)
        except psutil.NoSuchProcess:
            pass
    return out


def _run_and_kill(workdir: Path, run: str, *extra: str) -> subprocess.CompletedProcess:
    """`rlinf rl` with 2 generation workers, one of them killed with -9 after the first iteration."""
    cmd = [RLINF, "rl", *GRPO, "text.iterations=6", "placement.generation.workers=2", f"run_dir={run}", *extra]
    proc = subprocess.Popen(cmd, cwd=workdir, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    metrics = workdir / run / "metrics.jsonl"
    deadline = time.time() + 300
    while not (metrics.is_file() and '"iteration": 1.0' in metrics.read_text()):
        assert proc.poll() is None and time.time() < deadline, proc.communicate()[1][-3000:]
        time.sleep(0.05)
    workers = _generation_workers(proc.pid)
    assert len(workers) == 2, workers
    os.kill(workers[0].pid, signal.SIGKILL)
    out, err = proc.communicate(timeout=600)
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


def test_a_killed_worker_is_restarted_and_the_run_equals_the_trainers(workdir):
    ref = subprocess.run([RLINF, "rl", *GRPO, "text.iterations=6", "run_dir=ref"], cwd=workdir, capture_output=True,
                         text=True, timeout=600)
    assert ref.returncode == 0, ref.stderr[-3000:]
    r = _run_and_kill(workdir, "gen")
    assert r.returncode == 0, r.stderr[-3000:]
    warnings = [line for line in r.stderr.splitlines() if line.startswith("warning: generation worker")]
    assert len(warnings) == 1 and "died during sampling" in warnings[0] and "(1/3 for this worker)" in warnings[0], \
        r.stderr[-3000:]
    assert sum(column(workdir / "gen", "rollout/runtime/generation_restarts")) == 1.0
    # synchronous: the request went again with the same weights and sampler state
    assert_same_run(workdir / "ref", workdir / "gen")


def test_broadcast_sync_equals_the_trainer_through_a_killed_worker(workdir):
    """placement.generation.sync=broadcast: weights reach the workers by a gloo broadcast from the
    trainer; the killed worker's replacement joins a group formed again and takes the current weights."""
    ref = subprocess.run([RLINF, "rl", *GRPO, "text.iterations=6", "run_dir=ref"], cwd=workdir, capture_output=True,
                         text=True, timeout=600)
    assert ref.returncode == 0, ref.stderr[-3000:]
    r = _run_and_kill(workdir, "gen", "placement.generation.sync=broadcast")
    assert r.returncode == 0, r.stderr[-3000:]
    assert "executor=local (weights by gloo broadcast)" in r.stderr, r.stderr[-3000:]
    assert sum(line.startswith("warning: generation worker") for line in r.stderr.splitlines()) == 1, r.stderr[-3000:]
    assert sum(column(workdir / "gen", "rollout/runtime/generation_restarts")) == 1.0
    assert all(s >= 0 for s in column(workdir / "gen", "time/weight_sync_s"))
    assert_same_run(workdir / "ref", workdir / "gen")


def test_a_worker_dying_past_max_restarts_is_one_line(workdir):
    r = _run_and_kill(workdir, "gen", "runtime.max_restarts=0")
    assert r.returncode == 2, r.stderr[-3000:]
    errors = [line for line in r.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "generation worker" in errors[0] and "runtime.max_restarts=0" in errors[0], r.stderr
    assert "Traceback" not in r.stderr


def test_staleness_one_samples_a_version_behind_and_resumes(cli, workdir):
    stale = [*GRPO, "text.iterations=4", "placement.generation.workers=2", "runtime.max_staleness=1",
             "checkpoint.interval=1", "checkpoint.keep=5"]
    r = cli("rl", *stale, "run_dir=stale")
    assert r.code == 0, r.err
    lag = column(workdir / "stale", "rollout/weight_version_lag")
    assert lag == [0.0, 1.0, 1.0, 1.0]  # the first draw waits for no update; each later one was asked for before it
    assert column(workdir / "stale", "rollout/runtime/generation_parts") == [2.0] * 4
    assert all(m["train/samples"] == 16 for m in rows(workdir / "stale") if "train/samples" in m)
    # the workers sampled iterations 2-4's first draws while the trainer updated: measured, not zero
    busy, both = (column(workdir / "stale", f"time/generation_{k}") for k in ("busy_s", "overlap_s"))
    frac = column(workdir / "stale", "time/generation_overlap_frac")
    assert both[0] == frac[0] == 0.0 and all(x > 0 for x in both[1:]) and all(0 < f <= 1 for f in frac[1:]), (both, frac)
    assert all(b >= o for b, o in zip(busy, both))
    # resume works (not bit for bit: the in-flight draw is not checkpointed; it is sampled again, with newer weights)
    r = cli("rl", f"resume={workdir / 'stale/checkpoints/iter_000002'}", "run_dir=resumed", *QUIET)
    assert r.code == 0, r.err
    result = json.loads((workdir / "resumed/result.json").read_text())
    assert result["iterations"] == 4
    assert column(workdir / "resumed", "rollout/weight_version_lag")[-2:] == [0.0, 1.0]


TEXT = ["--algo", "grpo", "sim=arithmetic", "model=hf"]


@pytest.mark.parametrize("args, needle", [
    ([*TEXT, "placement.generation.workers=-1"], "bad value for 'placement.generation.workers': -1; it must be an integer >= 0"),
    ([*TEXT, "placement.generation.sync=nccl"], "bad value for 'placement.generation.sync': "),
    ([*TEXT, "runtime.max_staleness=-1"], "bad value for 'runtime.max_staleness': -1; it must be an integer >= 0"),
    ([*TEXT, "runtime.max_staleness=1"], "there are none: set placement.generation.workers=N"),
    (["--algo", "ppo", "sim=gymnasium", "model=mlp", "placement.generation.workers=2"],
     "it needs a text task (sim=arithmetic, jsonl, ...), and sim=gymnasium is not one"),
])
def test_bad_generation_settings_are_one_line(cli_proc, workdir, args, needle):
    r = cli_proc("rl", *args, *QUIET)
    assert r.code == 2 and needle in r.err, r.err
    errors = [line for line in r.err.splitlines() if line.strip()]
    assert errors[-1].startswith("error:") and "Traceback" not in r.err
    assert not (workdir / "rlinf_runs").exists() or not any((workdir / "rlinf_runs").rglob("metrics.jsonl"))


@pytest.mark.slow
@pytest.mark.learning
def test_stale_generation_learns_like_synchronous_sampling(cli, workdir, learning):
    """GRPO with the rollout sampled one version behind (2 workers, max_staleness=1) raises held-out
    greedy accuracy on one-digit sums like sampling in the trainer does: the recipe of
    test_text_cli.py's GRPO learning test, whose bar (+0.05) it shares with room to spare.
    benchmarks/generation_staleness.py, seeds 0-9 on this CPU: +0.20 to +0.47 (median +0.32) against
    +0.16 to +0.36 (median +0.27) in the trainer; lesser-CPU draws in docs/benchmarks.md."""
    r = cli("collect", "sim=arithmetic", "sim.digits=1", "policy=expert", "episodes=1000", "output=data/add.jsonl", *QUIET)
    assert r.code == 0, r.err
    r = cli("sft", "dataset=data/add.jsonl", *TINY, "algo.epochs=3", "algo.minibatch_size=32", "algo.lr=3e-3",
            "eval.episodes=0", "run_dir=sft", "seed=0", *QUIET)  # one clone: the RL seed varies
    assert r.code == 0, r.err
    init = json.loads((workdir / "sft/result.json").read_text())["checkpoint"]
    r = cli("rl", "--algo", "grpo", f"init={init}", "text.iterations=30", "algo.groups=8",
            "algo.group_size=8", "algo.epochs=1", "algo.lr=2e-4", "eval.episodes=64", "eval.seed=0", "eval.interval=30",
            "placement.generation.workers=2", "runtime.max_staleness=1", "run_dir=rl", f"seed={learning.seed}", *QUIET)
    assert r.code == 0, r.err
    before = next(m["eval/accuracy"] for m in rows(workdir / "rl") if m["step"] == 0)
    after = json.loads((workdir / "rl/result.json").read_text())["eval"]["accuracy"]
    assert max(column(workdir / "rl", "rollout/weight_version_lag")) == 1.0  # it did sample a version behind
    learning.record(after - before, 0.10, before=before)
    assert after >= before + 0.10, (before, after)


@pytest.mark.slow
def test_each_trainer_rank_samples_in_workers_of_its_own(workdir):
    """placement.trainer.ranks=2 (executor=local) with a generation worker per rank equals the same two
    ranks sampling in themselves: every rank writes its own policy for its workers (transformers 5
    writes nothing from rank 1 unless told to) and publishes its weights to them."""
    for run, extra in (("ref", []), ("gen", ["placement.generation.workers=1"])):
        r = subprocess.run([RLINF, "rl", *GRPO, "placement.trainer.ranks=2", f"run_dir={run}", *extra], cwd=workdir,
                           capture_output=True, text=True, timeout=900)
        assert r.returncode == 0, r.stderr[-3000:]
    assert "sampling: 1 generation worker(s)" in r.stderr + r.stdout
    assert_same_run(workdir / "ref", workdir / "gen")
    assert column(workdir / "gen", "rollout/runtime/generation_parts") == [1.0] * 3
