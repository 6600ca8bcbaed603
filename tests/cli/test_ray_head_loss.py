"""Losing the Ray head mid-run is one line: a two-node cluster on this machine, CartPole PPO with its
env-worker actor on the second node, the head's GCS killed with -9 after a few iterations."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

BIN = Path(sys.executable).parent
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "COLUMNS": "200", "RAY_AUTH_MODE": "disabled"}


@pytest.mark.slow
def test_losing_the_ray_head_stops_the_run_in_one_line(tmp_path: Path) -> None:
    import psutil
    from ray._private import ray_constants
    from ray.cluster_utils import Cluster

    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    os.environ.setdefault("RAY_gcs_server_port_wait_time_s", "120")
    c = Cluster(initialize_head=True, connect=False, head_node_args={"num_cpus": 2, "include_dashboard": False})
    try:
        c.add_node(num_cpus=2, resources={"envs": 2})
        c.wait_for_nodes()
        address = c.address
        cmd = [str(BIN / "rlinf"), "rl", "num_envs=4", "algo.rollout_steps=32", "total_steps=1000000", "eval.episodes=0",
               "progress=false", "tracking.enabled=false", "checkpoint.interval=1", "executor=ray",
               f"executor.address={c.address}", "+executor.worker_resources.envs=1", "runtime.env_workers=1",
               f"run_dir={tmp_path / 'run'}"]
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV)
        try:
            metrics, deadline = tmp_path / "run" / "metrics.jsonl", time.time() + 300
            while not (metrics.is_file() and len(metrics.read_text().splitlines()) >= 3):
                assert proc.poll() is None and time.time() < deadline, proc.communicate()[1][-3000:]
                time.sleep(0.2)
            # this cluster's GCS, as its head node recorded it starting: not another test's running beside it
            # under xdist, nor one an earlier test file left alive in this worker process (CI found both)
            gcs = c.head_node.all_processes[ray_constants.PROCESS_TYPE_GCS_SERVER]
            assert len(gcs) == 1 and psutil.Process(gcs[0].process.pid).name().startswith("gcs_server"), gcs
            os.kill(gcs[0].process.pid, signal.SIGKILL)
            t0 = time.time()
            _, err = proc.communicate(timeout=120)
            took = time.time() - t0
        finally:
            if proc.poll() is None:
                proc.kill()
    finally:
        try:
            c.shutdown()
        except Exception:  # the head is gone: shutting the rest down may complain
            pass
    assert proc.returncode == 2, err[-3000:]
    assert "Traceback" not in err
    last = err.strip().splitlines()[-1]
    assert last.startswith(f"error: lost the Ray head: its GCS at {address} has not answered"), last
    assert took < 45, took  # before Ray's own 60 s end of the process
    assert any((tmp_path / "run" / "checkpoints").glob("iter_*"))  # what it wrote stays: resume continues from it
