"""Trainer ranks as Ray actors: one placement group of K bundles, one actor per bundle.

Ranks follow the bundles sorted by node address, then bundle index, so the same cluster and
placement give the same rank order every time (rank 0 on the first node). Each actor gets the
variables torchrun would give its rank and runs ``rlinf_cli.api.run_rank``: the stage itself, in a
gloo (CPU) or nccl (GPU) process group whose rendezvous is rank 0's node. The driver waits for all
of them; an actor that dies (killed, its node lost, out of memory) stops the others and comes back
as ``RankDied``, which the core words as one line naming the checkpoint to resume from.
"""

from __future__ import annotations

import ipaddress
import os
import socket
import uuid
from typing import Any

from rlinf_cli.api import RankDied, RankJob, UserError, run_rank

PLACE_TIMEOUT_S = 120.0  # how long the cluster may take to find room for every rank


class TrainerRank:
    """The actor hosting one trainer rank."""

    def node(self) -> tuple[str, str]:
        import ray

        return ray.util.get_node_ip_address(), ray.get_runtime_context().get_node_id()

    def free_port(self) -> int:
        """A port free on this node's addresses: rank 0's serves the process group's rendezvous."""
        with socket.socket() as s:
            s.bind(("", 0))
            return int(s.getsockname()[1])

    def run(self, job: RankJob, env: dict[str, str]) -> Any:
        import ray

        if ray.get_gpu_ids():  # Ray shows this actor only its own GPUs: the rank's device is the first visible
            env = {**env, "LOCAL_RANK": "0"}
        return run_rank(job, env)


def _ip_key(ip: str) -> tuple:
    try:
        return (0, int(ipaddress.ip_address(ip)))
    except ValueError:  # a host name
        return (1, ip)


def rank_order(ray: Any, pg: Any) -> list[tuple[int, str, str]]:
    """``(bundle index, node ip, node id)`` per rank, sorted by node address then bundle index."""
    from ray.util import placement_group_table

    nodes = {n["NodeID"]: n["NodeManagerAddress"] for n in ray.nodes()}
    where = placement_group_table(pg)["bundles_to_node_id"]
    bundles = [(int(b), nodes.get(node, "?"), node) for b, node in where.items()]
    return sorted(bundles, key=lambda b: (_ip_key(b[1]), b[2], b[0]))


def start_ranks(ray: Any, job: RankJob, namespace: str) -> Any:
    """Place and run ``job.ranks`` trainer ranks; rank 0's result (the stage's result)."""
    from ray.util.placement_group import placement_group, remove_placement_group
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    t = job.trainer
    pg = placement_group([dict(t.bundle) for _ in range(job.ranks)], strategy=t.strategy)
    actors: list[Any] = []
    try:
        ready, _ = ray.wait([pg.ready()], timeout=PLACE_TIMEOUT_S)
        if not ready:
            raise UserError(f"the Ray cluster has no room for {job.ranks} trainer ranks of {t.bundle} "
                            f"(placement.trainer, strategy {t.strategy}) after {PLACE_TIMEOUT_S:.0f} s; it has "
                            f"{ray.available_resources()} free: lower placement.trainer or add nodes")
        order = rank_order(ray, pg)
        tag = uuid.uuid4().hex[:8]
        actor_cls = ray.remote(TrainerRank)
        for rank, (bundle, _ip, _node) in enumerate(order):
            opts = {"num_cpus": t.cpus, "num_gpus": t.gpus, "resources": dict(t.resources),
                    "name": f"rlinf-trainer-{tag}-rank{rank}", "namespace": namespace, "max_restarts": 0,
                    "scheduling_strategy": PlacementGroupSchedulingStrategy(pg, placement_group_bundle_index=bundle)}
            if t.memory_gb:
                opts["memory"] = t.memory_gb * 2**30
            actors.append(actor_cls.options(**opts).remote())
        return _run(ray, job, actors, order)
    finally:
        for a in actors:
            try:
                ray.kill(a)
            except Exception:  # already gone
                pass
        remove_placement_group(pg)


def _run(ray: Any, job: RankJob, actors: list[Any], order: list[tuple[int, str, str]]) -> Any:
    addr, _ = ray.get(actors[0].node.remote())
    port = ray.get(actors[0].free_port.remote())
    per_node: dict[str, list[int]] = {}
    for rank, (_b, _ip, node) in enumerate(order):
        per_node.setdefault(node, []).append(rank)
    pending = {}
    for rank, actor in enumerate(actors):
        local = per_node[order[rank][2]]
        env = job.rank_env(rank, local.index(rank), len(local), addr, port)
        env.update({"OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"), "LP_NUM_THREADS": "1"})
        pending[actor.run.remote(job, env)] = rank
    result = None
    while pending:
        done, _ = ray.wait(list(pending), num_returns=1)
        rank = pending.pop(done[0])
        try:
            out = ray.get(done[0])
        except ray.exceptions.RayActorError as exc:  # the process or its node is gone
            text = str(exc).strip().splitlines()
            raise RankDied(rank, f"its actor on node {order[rank][1]} is gone ({text[0] if text else 'no reason given'})") from None
        except ray.exceptions.RayTaskError as exc:
            cause = getattr(exc, "cause", None)
            if isinstance(cause, UserError):  # bad input found by a rank: the same one line as in one process
                raise UserError(str(cause)) from None
            raise
        if rank == 0:
            result = out
    return result
