"""Env instances on this machine: in this process (collocated) or in worker processes.

The core places the envs (``runtime.mode``, shards, shared memory: ``rlinf_cli.api.WorkerExecutor``);
this executor starts the worker processes, (``placement.trainer.ranks``) trainer ranks as
processes of this machine, as torchrun would (rlinf_executor_local/ranks.py), and
(``placement.generation.workers``) a language model's generation workers as processes here. Observations from workers travel through shared
memory when they are large and uncompressed, else pickled (and compressed with
``env.obs_compression``) through the worker's pipe.
"""

from __future__ import annotations

from typing import Any

from rlinf_cli.api import (GenerationPlan, RankJob, WorkerExecutor, WorkerHandle, WorkerPlan, start_generation_processes,
                           start_processes)


class LocalExecutor(WorkerExecutor):
    name = "local"
    in_process = True  # runtime.mode=collocated: envs stepped in the driver
    shared_memory = True  # the workers are processes of this machine

    def start_workers(self, plan: WorkerPlan) -> list[WorkerHandle]:
        return start_processes(plan)

    def label(self, plan: WorkerPlan) -> str:
        rt = plan.runtime
        transport = "shared memory" if plan.shm_name else f"pipe, obs_compression={rt.obs_compression}" + (
            "+xor-delta" if rt.obs_delta else "")
        return (f"local, {rt.mode}: {plan.num_envs} envs in {plan.num_workers} worker process(es)"
                + (f", {plan.stages} pipeline stages" if rt.mode == "hybrid" else "") + f", {transport}")

    def start_generation_workers(self, plan: GenerationPlan) -> list[WorkerHandle]:
        """``placement.generation.workers`` processes here; weights reach them through shared memory."""
        return start_generation_processes(plan)

    def start_ranks(self, job: RankJob) -> Any:
        """``placement.trainer.ranks`` rank processes here (reservations are Ray's business: not read)."""
        from rlinf_executor_local.ranks import start_ranks

        return start_ranks(job)
