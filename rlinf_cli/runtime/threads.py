"""How many torch threads a run uses (``train.threads``).

One thread is fastest for the small MLP/CNN policies most embodied runs train: their matmuls are
too small to split, and env workers want the other cores. A language model or a VLA is the
opposite: a SmolLM2-135M GRPO run kept 1.7 of a 2-core machine's cores busy (on one thread it
used one; not yet timed side by side). ``auto`` (the default) therefore starts with one thread and, once the policy is built, gives
a policy of ``LARGE_MODEL`` parameters or more every core this process may use (shared between
the ranks of a torchrun launch on one machine).
"""

from __future__ import annotations

import os
from typing import Any

LARGE_MODEL = 20_000_000  # parameters; the tiny text preset (~5M) and every bundled MLP stay at 1


def parse(setting: Any) -> int | None:
    """``train.threads`` -> a thread count, or None for ``auto``."""
    if setting is None or str(setting).strip().lower() == "auto":
        return None
    return int(setting)


def initial(setting: Any) -> int:
    """Threads before the policy exists: the set number, or 1 under ``auto``."""
    n = parse(setting)
    return 1 if n is None else n


def cores_per_rank() -> int:
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        cores = os.cpu_count() or 1
    return max(1, cores // max(1, int(os.environ.get("LOCAL_WORLD_SIZE", "1"))))


def fit(policy: Any, setting: Any) -> int:
    """Under ``auto``, every core for a large policy; returns the threads in force."""
    import torch

    if parse(setting) is None and hasattr(policy, "parameters"):
        if sum(p.numel() for p in policy.parameters()) >= LARGE_MODEL:
            torch.set_num_threads(cores_per_rank())
    return torch.get_num_threads()
