"""placement.trainer: settings, the driver's decisions and messages, Ray's rank order, doctor's
cluster lines; without starting any rank (tests/cli/test_ray_trainer_ranks.py runs them on Ray)."""

from __future__ import annotations

import types
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from rlinf_cli.errors import UserError
from rlinf_cli.stages import ranks


def _cfg(**trainer) -> object:
    return OmegaConf.create({"placement": {"trainer": trainer}, "executor": {"name": "fake"}, "run_dir": None,
                             "runs_dir": "runs", "resume": None, "sim": {"name": "gym"}, "algo": {"name": "ppo"}})


def test_defaults_keep_one_process_and_bad_values_are_one_line():
    t = ranks.trainer_placement(OmegaConf.create({}))
    assert (t.ranks, t.cpus, t.gpus, t.strategy) == (1, 1.0, 0.0, "PACK")
    assert ranks.launch("rl", _cfg()) is None  # one rank: this process trains, no executor asked
    assert ranks.TrainerPlacement(ranks=2, cpus=2, gpus=1, memory_gb=1.5, resources={"trainer": 1}).bundle == \
        {"CPU": 2.0, "GPU": 1.0, "memory": 1.5 * 2**30, "trainer": 1.0}
    with pytest.raises(UserError, match="placement.trainer.strategy must be one of PACK"):
        ranks.trainer_placement(_cfg(strategy="ROUND_ROBIN"))
    with pytest.raises(UserError, match="placement.trainer.ranks must be >= 1"):
        ranks.trainer_placement(_cfg(ranks=0))
    with pytest.raises(UserError, match="'placement.trainer.rank' is not an option.*Did you mean 'placement.trainer.ranks'"):
        ranks.trainer_placement(_cfg(rank=2))


def test_each_rank_gets_the_variables_torchrun_gives_it():
    job = ranks.RankJob("rl", "{}", ranks.TrainerPlacement(ranks=4), "/w", "/w/run")
    env = job.rank_env(3, 1, 2, "10.0.0.2", 29500)
    assert env == {"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2", "GROUP_RANK": "0",
                   "MASTER_ADDR": "10.0.0.2", "MASTER_PORT": "29500"}


def test_an_executor_without_ranks_is_refused_in_one_line(monkeypatch):
    import rlinf_cli.collectors.embodied_env as embodied_env

    monkeypatch.setattr(embodied_env, "make_executor", lambda node, runtime: object())  # an executor of API 1.2
    with pytest.raises(UserError) as err:
        ranks.launch("rl", _cfg(ranks=2))
    assert str(err.value) == ("executor=fake does not start trainer ranks: use executor=ray (or local) with "
                              "placement.trainer.ranks=2, or torchrun --nproc_per_node=2 $(which rlinf) rl ... with "
                              "placement.trainer.ranks=1")


def test_under_torchrun_the_ranks_must_agree(monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "4")
    with pytest.raises(UserError, match="torchrun starts the ranks itself"):
        ranks.launch("rl", _cfg(ranks=2))
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert ranks.launch("rl", _cfg(ranks=2)) is None  # a rank already: it trains


class _Executor:
    def __init__(self, died: bool):
        self.died, self.jobs = died, []

    def start_ranks(self, job):
        self.jobs.append(job)
        if self.died:
            ckpts = Path(job.run_dir) / "checkpoints"
            for name in ("iter_000001", "iter_000002"):
                (ckpts / name).mkdir(parents=True)
                (ckpts / name / "trainer_state.json").write_text("{}")
            (ckpts / ".iter_000003.tmp").mkdir()  # a checkpoint being written when the rank died
            raise ranks.RankDied(1, "its actor on node 10.0.0.7 is gone (killed)")
        return {"stage": "rl"}


def _with_executor(monkeypatch, executor: _Executor) -> None:
    import rlinf_cli.collectors.embodied_env as embodied_env

    monkeypatch.setattr(embodied_env, "make_executor", lambda node, runtime: executor)


def test_the_driver_fixes_rank_0s_run_directory_and_returns_its_result(monkeypatch, workdir):
    ex = _Executor(died=False)
    _with_executor(monkeypatch, ex)
    assert ranks.launch("rl", _cfg(ranks=2)) == {"stage": "rl"}
    job = ex.jobs[0]
    run_dir = Path(job.run_dir)
    assert run_dir.is_absolute() and run_dir.parent == workdir / "runs" / "rl" and run_dir.name.endswith("-gym-ppo")
    assert OmegaConf.create(job.config_yaml).run_dir == job.run_dir and job.cwd == str(workdir)


def test_a_dead_rank_is_one_line_naming_the_last_checkpoint(monkeypatch, workdir):
    _with_executor(monkeypatch, _Executor(died=True))
    cfg = _cfg(ranks=2)
    cfg.run_dir = "r"
    with pytest.raises(UserError) as err:
        ranks.launch("rl", cfg)
    assert str(err.value) == ("trainer rank 1 died: its actor on node 10.0.0.7 is gone (killed); the run stopped, "
                              f"resume with: rlinf rl resume={workdir / 'r' / 'checkpoints' / 'iter_000002'}")
    assert ranks.resume_note(workdir / "none") == f"before its first checkpoint (metrics so far are in {workdir / 'none'})"


def test_ray_ranks_follow_node_address_then_bundle_index(monkeypatch):
    pytest.importorskip("ray")
    import ray.util

    from rlinf_executor_ray.ranks import rank_order

    nodes = [{"NodeID": "a", "NodeManagerAddress": "10.0.0.10"}, {"NodeID": "b", "NodeManagerAddress": "10.0.0.9"}]
    table = {"bundles_to_node_id": {0: "a", 1: "b", 2: "a", 3: "b"}}
    monkeypatch.setattr(ray.util, "placement_group_table", lambda pg: table)
    order = rank_order(types.SimpleNamespace(nodes=lambda: nodes), object())
    # numerically, 10.0.0.9 comes before 10.0.0.10 (as text it would not)
    assert order == [(1, "10.0.0.9", "b"), (3, "10.0.0.9", "b"), (0, "10.0.0.10", "a"), (2, "10.0.0.10", "a")]


def test_doctor_says_when_there_is_no_cluster_and_describes_a_node(monkeypatch, tmp_path):
    pytest.importorskip("ray")
    from rlinf_executor_ray import cluster

    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.setattr(cluster, "CURRENT_CLUSTER", tmp_path / "none")
    assert cluster.report()[0].startswith("ray: no cluster to report")
    node = {"NodeManagerAddress": "10.0.0.3", "NodeID": "0123456789abcdef",
            "Resources": {"CPU": 8.0, "GPU": 2.0, "memory": 16 * 2**30, "object_store_memory": 1.0, "envs": 8.0,
                          "node:10.0.0.3": 1.0, "accelerator_type:H100": 1.0}}
    assert cluster.node_line(node) == "node 10.0.0.3 (01234567): 8 CPUs, 2 GPUs, 16.0 GiB memory, envs 8"


def test_ray_executor_joins_the_cluster_ray_address_names(monkeypatch):
    """Inside a Ray job (a KubeRay RayJob's entrypoint) RAY_ADDRESS is set: executor=ray joins that
    cluster; without it (and without executor.address) it sizes a local instance of its own."""
    pytest.importorskip("ray")
    import rlinf_executor_ray.executor as ex
    from rlinf_executor_ray import headwatch

    calls = []
    fake = types.SimpleNamespace(is_initialized=lambda: False, init=lambda **kw: calls.append(kw))
    monkeypatch.setattr(ex, "_ray", lambda: fake)
    monkeypatch.setattr(headwatch, "watch", lambda ray: None)
    monkeypatch.setenv("RAY_ADDRESS", "10.0.0.1:6379")
    ex.RayExecutor({})._init(4)
    assert calls[-1]["address"] == "10.0.0.1:6379" and "num_cpus" not in calls[-1]
    monkeypatch.delenv("RAY_ADDRESS")
    ex.RayExecutor({})._init(4)
    assert "address" not in calls[-1] and calls[-1]["num_cpus"] >= 4
