"""Trainer ranks as Ray actors (placement.trainer.ranks) on a two-node Ray cluster on this machine.

The head node offers the custom resource ``trainer``, the second node ``envs``: the 2 trainer
ranks reserve ``trainer`` (placement.trainer.resources) and the env-worker actors ``envs``
(executor.worker_resources), so Ray can only put the ranks on the head and every env worker on
the other node. The run must be the very run ``torchrun --nproc_per_node=2`` makes with the same
seeds: every metric row and the final weights equal.
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import wait_for_checkpoint

# Not `numerics`: both launch paths run the same kernels on the same CPU, so their equality holds on
# any CPU; make test-portable would only run these minutes-long tests twice more.

BIN = Path(sys.executable).parent
# 8 iterations of 2 ranks x 4 envs x 32 steps; a checkpoint each (the killed run resumes from one)
ARGS = ["num_envs=4", "algo.rollout_steps=32", "total_steps=2048", "eval.episodes=2", "progress=false",
        "tracking.enabled=false", "checkpoint.interval=1", "checkpoint.keep=20", "seed=3"]
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "COLUMNS": "200", "RAY_AUTH_MODE": "disabled"}


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("ranks")


@pytest.fixture(scope="module")
def cluster(base: Path):
    """Two Ray nodes on this machine: the head (2 CPUs, ``trainer``) and one for env workers (4 logical CPUs, ``envs``)."""
    from ray.cluster_utils import Cluster

    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    os.environ.setdefault("RAY_gcs_server_port_wait_time_s", "120")  # a busy 2-core machine is slow to start a GCS
    for attempt in range(3):
        # a raylet gets a fixed 30 s to register (Ray 2.60); under load it can miss it, and a fresh
        # start has come up so far (as the executor's own ray.init retries)
        c = None
        try:
            c = Cluster(initialize_head=True, connect=False,
                        head_node_args={"num_cpus": 2, "resources": {"trainer": 2}, "include_dashboard": False})
            # room for each rank's training env actor and, beside it, its evaluations' (eval.best)
            c.add_node(num_cpus=4, resources={"envs": 4})
            c.wait_for_nodes()
            break
        except Exception as exc:
            if c is not None:
                c.shutdown()
            if "timed out" not in str(exc).lower() or attempt == 2:
                raise
    try:
        yield c
    finally:
        c.shutdown()


@pytest.fixture(scope="module")
def torchrun_run(base: Path) -> Path:
    """The reference: the same run under torchrun (envs in each rank's process)."""
    cmd = [str(BIN / "torchrun"), "--nproc_per_node=2", f"--master_port={_port()}", str(BIN / "rlinf"), "rl", *ARGS,
           "run_dir=tr"]
    proc = subprocess.run(cmd, cwd=base, capture_output=True, text=True, timeout=900, env=ENV)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return base / "tr"


def _ray_args(cluster) -> list[str]:
    return ["executor=ray", f"executor.address={cluster.address}", "placement.trainer.ranks=2",
            "+placement.trainer.resources.trainer=1", "+executor.worker_resources.envs=1", "runtime.env_workers=1"]


def _rows(run: Path) -> list[dict]:
    skip = ("time/", "perf/", "sys/")  # wall-clock columns differ between any two runs
    return [{k: v for k, v in json.loads(line).items() if not k.startswith(skip)}
            for line in (run / "metrics.jsonl").read_text().splitlines()]


def _same_weights(a: Path, b: Path) -> None:
    import torch
    from safetensors.torch import load_file

    wa, wb = (load_file(str(d / "checkpoints" / "final" / "model.safetensors")) for d in (a, b))
    assert wa.keys() == wb.keys()
    for k in wa:
        assert torch.equal(wa[k], wb[k]), k


@pytest.mark.slow
def test_two_trainer_ranks_as_ray_actors_equal_torchrun(cluster, torchrun_run: Path, base: Path) -> None:
    cmd = [str(BIN / "rlinf"), "rl", *ARGS, *_ray_args(cluster), "run_dir=ray"]
    proc = subprocess.run(cmd, cwd=base, capture_output=True, text=True, timeout=900, env=ENV)
    assert proc.returncode == 0, proc.stderr[-3000:]
    ray_run = base / "ray"
    want, got = _rows(torchrun_run), _rows(ray_run)  # Ray's rows add transport columns
    assert len(got) == len(want) >= 8
    assert [r["env_steps"] for r in got if "train/policy_loss" in r][:2] == [256.0, 512.0]  # 2 ranks x 4 envs x 32
    assert [{k: row[k] for k in w} for row, w in zip(got, want)] == want
    result = json.loads((ray_run / "result.json").read_text())
    assert result["world_size"] == 2 and result["eval"] == json.loads((torchrun_run / "result.json").read_text())["eval"]
    _same_weights(torchrun_run, ray_run)
    assert "runtime: ray (" in proc.stderr  # rank 0's notes reach this terminal
    assert not list(base.glob("rlinf_runs")), "rank 1 wrote a run directory"


def _kill_rank(cluster, rank: int, run: Path, proc: subprocess.Popen) -> None:
    """Once the run has a checkpoint, kill rank ``rank``'s actor, as a lost process or node would end."""
    import ray

    wait_for_checkpoint(run, 2, proc, timeout=600, poll=0.2)
    ray.init(address=cluster.address, log_to_driver=False)
    try:
        names = [a["name"] for a in ray.util.list_named_actors(all_namespaces=True)
                 if a["name"].startswith("rlinf-trainer-") and a["name"].endswith(f"-rank{rank}")]
        assert len(names) == 1, names
        ray.kill(ray.get_actor(names[0], namespace="rlinf"))
    finally:
        ray.shutdown()


@pytest.mark.slow
def test_a_killed_trainer_rank_stops_in_one_line_and_resumes_to_the_same_weights(cluster, torchrun_run: Path,
                                                                                  base: Path) -> None:
    cmd = [str(BIN / "rlinf"), "rl", *ARGS, *_ray_args(cluster), "run_dir=killed"]
    proc = subprocess.Popen(cmd, cwd=base, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV)
    try:
        _kill_rank(cluster, 1, base / "killed", proc)
        _, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 2, err[-3000:]
    assert "Traceback" not in err
    last = err.strip().splitlines()[-1]
    assert last.startswith("error: trainer rank 1 died: its actor on node "), last
    found = re.search(r"resume with: rlinf rl resume=(\S+)$", last)
    assert found, last
    # the whole config (executor, placement, run directory) comes back from the checkpoint
    proc2 = subprocess.run([str(BIN / "rlinf"), "rl", f"resume={found.group(1)}"], cwd=base, capture_output=True,
                           text=True, timeout=900, env=ENV)
    assert proc2.returncode == 0, proc2.stderr[-3000:]
    _same_weights(torchrun_run, base / "killed")


@pytest.mark.slow
def test_doctor_reports_the_cluster(cluster, base: Path) -> None:
    proc = subprocess.run([str(BIN / "rlinf"), "doctor"], cwd=base, capture_output=True, text=True, timeout=300,
                          env={**ENV, "RAY_ADDRESS": cluster.address})
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = [ln.strip() for ln in proc.stdout.splitlines()]
    head = next(ln for ln in lines if ln.startswith("ray ") and " cluster at " in ln)
    assert f"cluster at {cluster.address}: 2 node(s), 6 CPUs, 0 GPUs" in head, head
    nodes = [ln for ln in lines if ln.startswith("node ")]
    assert len(nodes) == 2 and sum("2 CPUs, 0 GPUs" in n for n in nodes) == 1 and sum("4 CPUs, 0 GPUs" in n for n in nodes) == 1, nodes
    assert sum("trainer 2" in n for n in nodes) == 1 and sum("envs 4" in n for n in nodes) == 1, nodes


@pytest.mark.slow
def test_text_grpo_ranks_as_ray_actors_with_generation_workers_on_the_other_node_equal_torchrun(cluster, base: Path) -> None:
    """GRPO on a language model: 2 trainer ranks as actors on the head, each rank's generation worker an
    actor on the other node (it reserves ``envs``), weights published through the object store every
    update; every metric row and the final weights equal ``torchrun --nproc_per_node=2`` sampling in
    each rank's own process."""
    from generation_runs import GRPO, assert_same_run

    tr = [str(BIN / "torchrun"), "--nproc_per_node=2", f"--master_port={_port()}", str(BIN / "rlinf"), "rl", *GRPO,
          "run_dir=text-tr"]
    proc = subprocess.run(tr, cwd=base, capture_output=True, text=True, timeout=900, env=ENV)
    assert proc.returncode == 0, proc.stderr[-3000:]
    cmd = [str(BIN / "rlinf"), "rl", *GRPO, "executor=ray", f"executor.address={cluster.address}",
           "placement.trainer.ranks=2", "+placement.trainer.resources.trainer=1", "placement.generation.workers=1",
           "+placement.generation.resources.envs=1", "run_dir=text-ray"]
    proc = subprocess.run(cmd, cwd=base, capture_output=True, text=True, timeout=900, env=ENV)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "generation worker(s), executor=ray" in proc.stderr + proc.stdout
    assert_same_run(base / "text-tr", base / "text-ray")
