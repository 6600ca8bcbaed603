"""Trainer ranks as processes of this machine (placement.trainer.ranks with executor=local): the
same run as torchrun --nproc_per_node=2, and a killed rank ends in one line and resumes exactly."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import wait_for_checkpoint

# Not `numerics`: both launch paths run the same kernels on the same CPU, so their equality holds on
# any CPU; make test-portable would only run these minutes-long tests twice more.

BIN = Path(sys.executable).parent
ARGS = ["num_envs=4", "algo.rollout_steps=32", "total_steps=2048", "eval.episodes=2", "progress=false",
        "tracking.enabled=false", "checkpoint.interval=1", "checkpoint.keep=20", "seed=5"]
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "COLUMNS": "200"}


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _rows(run: Path) -> list[dict]:
    skip = ("time/", "perf/", "sys/")  # wall-clock columns differ between any two runs
    return [{k: v for k, v in json.loads(line).items() if not k.startswith(skip)}
            for line in (run / "metrics.jsonl").read_text().splitlines()]


def _weights(run: Path) -> dict:
    from safetensors.torch import load_file

    return load_file(str(run / "checkpoints" / "final" / "model.safetensors"))


def _same_weights(a: Path, b: Path) -> None:
    import torch

    wa, wb = _weights(a), _weights(b)
    assert wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)


@pytest.fixture(scope="module")
def torchrun_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    base = tmp_path_factory.mktemp("local_ranks")
    cmd = [str(BIN / "torchrun"), "--nproc_per_node=2", f"--master_port={_port()}", str(BIN / "rlinf"), "rl", *ARGS,
           "run_dir=tr"]
    proc = subprocess.run(cmd, cwd=base, capture_output=True, text=True, timeout=900, env=ENV)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return base / "tr"


@pytest.mark.slow
def test_two_local_rank_processes_equal_torchrun(torchrun_run: Path) -> None:
    base = torchrun_run.parent
    proc = subprocess.run([str(BIN / "rlinf"), "rl", *ARGS, "placement.trainer.ranks=2", "run_dir=local"], cwd=base,
                          capture_output=True, text=True, timeout=900, env=ENV)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert _rows(base / "local") == _rows(torchrun_run)
    assert json.loads((base / "local" / "result.json").read_text())["world_size"] == 2
    _same_weights(torchrun_run, base / "local")
    assert not list(base.glob("rlinf_runs")), "rank 1 wrote a run directory"


def _rank_pid(driver: int, rank: int) -> int | None:
    """The child of ``driver`` started as rank ``rank`` (its environment says RANK=<rank>)."""
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            if int(stat.read_text().rsplit(")", 1)[1].split()[1]) != driver:
                continue
            env = (stat.parent / "environ").read_bytes().split(b"\0")
        except (OSError, IndexError, ValueError):  # gone meanwhile
            continue
        if f"RANK={rank}".encode() in env:
            return int(stat.parent.name)
    return None


@pytest.mark.slow
def test_a_killed_local_rank_stops_in_one_line_and_resumes_to_the_same_weights(torchrun_run: Path) -> None:
    base = torchrun_run.parent
    proc = subprocess.Popen([str(BIN / "rlinf"), "rl", *ARGS, "placement.trainer.ranks=2", "run_dir=killed"], cwd=base,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV)
    try:
        wait_for_checkpoint(base / "killed", 2, proc, timeout=600, poll=0.1)
        pid = _rank_pid(proc.pid, 1)
        assert pid is not None
        os.kill(pid, signal.SIGKILL)
        _, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 2 and "Traceback" not in err, err[-3000:]
    last = err.strip().splitlines()[-1]
    assert re.match(r"error: trainer rank 1 died: its process \d+ ended \(killed by SIGKILL\); the run stopped, "
                    r"resume with: rlinf rl resume=\S+/killed/checkpoints/iter_\d+$", last), last
    resume = last.rsplit("resume=", 1)[1]
    done = subprocess.run([str(BIN / "rlinf"), "rl", f"resume={resume}"], cwd=base, capture_output=True, text=True,
                          timeout=900, env=ENV)
    assert done.returncode == 0, done.stderr[-3000:]
    _same_weights(torchrun_run, base / "killed")


@pytest.mark.slow
def test_local_ranks_run_deepspeed_zero2_as_torchrun_does(tmp_path: Path) -> None:
    """The engine is the rank's own business: DeepSpeed ZeRO-2 (optimizer shards across the 2 ranks)
    gives the same rows and weights started by the executor as by torchrun."""
    args = [*ARGS[:2], "total_steps=512", *ARGS[3:], "train.backend=deepspeed", "train.zero_stage=2"]
    tr = subprocess.run([str(BIN / "torchrun"), "--nproc_per_node=2", f"--master_port={_port()}", str(BIN / "rlinf"),
                         "rl", *args, "run_dir=tr"], cwd=tmp_path, capture_output=True, text=True, timeout=900, env=ENV)
    assert tr.returncode == 0, tr.stderr[-3000:]
    local = subprocess.run([str(BIN / "rlinf"), "rl", *args, "placement.trainer.ranks=2", "run_dir=local"], cwd=tmp_path,
                           capture_output=True, text=True, timeout=900, env=ENV)
    assert local.returncode == 0, local.stderr[-3000:]
    assert json.loads((tmp_path / "local" / "result.json").read_text())["backend"] == "deepspeed"
    assert (tmp_path / "local" / "checkpoints" / "final" / "deepspeed").is_dir()
    assert _rows(tmp_path / "local") == _rows(tmp_path / "tr")
    _same_weights(tmp_path / "tr", tmp_path / "local")
