"""`rlinf doctor`'s view of a Ray cluster: a line per node with what it offers."""

from __future__ import annotations

import os
from pathlib import Path

# Where `ray start --head` records the address of the cluster it started on this machine.
CURRENT_CLUSTER = Path("/tmp/ray/ray_current_cluster")


def cluster_address() -> str | None:
    """RAY_ADDRESS, else a cluster started on this machine with `ray start`; None when neither."""
    if os.environ.get("RAY_ADDRESS"):
        return os.environ["RAY_ADDRESS"]
    try:
        text = CURRENT_CLUSTER.read_text().strip()
    except OSError:
        return None
    return text or None


def node_line(node: dict) -> str:
    res = node.get("Resources") or {}
    custom = {k: v for k, v in res.items() if k not in ("CPU", "GPU", "memory", "object_store_memory")
              and not k.startswith(("node:", "accelerator_type:"))}
    line = (f"node {node.get('NodeManagerAddress', '?')} ({str(node.get('NodeID', '?'))[:8]}): "
            f"{res.get('CPU', 0):g} CPUs, {res.get('GPU', 0):g} GPUs, {res.get('memory', 0) / 2**30:.1f} GiB memory")
    return line + (", " + ", ".join(f"{k} {v:g}" for k, v in sorted(custom.items())) if custom else "")


def report() -> list[str] | None:
    """One line for the cluster and one per live node; None without Ray."""
    try:
        import ray
    except ImportError:
        return None
    address = cluster_address()
    if address is None:
        return ["ray: no cluster to report (none started here with `ray start`, and RAY_ADDRESS is unset); "
                "executor=ray starts a local instance"]
    import logging

    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    try:
        ray.init(address=address, log_to_driver=False, logging_level=logging.ERROR, include_dashboard=False)
    except Exception as exc:  # unreachable, or an address that is not a cluster
        return [f"ray: cannot reach the cluster at {address}: {str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__}"]
    try:
        nodes = sorted((n for n in ray.nodes() if n.get("Alive")), key=lambda n: (n.get("NodeManagerAddress", ""), n.get("NodeID", "")))
    finally:
        ray.shutdown()
    total = {k: sum((n.get("Resources") or {}).get(k, 0) for n in nodes) for k in ("CPU", "GPU")}
    head = f"ray {ray.__version__} cluster at {address}: {len(nodes)} node(s), {total['CPU']:g} CPUs, {total['GPU']:g} GPUs"
    return [head, *(f"  {node_line(n)}" for n in nodes)]
