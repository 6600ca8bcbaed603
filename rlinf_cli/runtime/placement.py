"""Where envs run: runtime settings shared by executors, and the ``auto`` mode's probe.

Modes (``runtime.mode``):

- ``collocated``: envs stepped in the driver process, one after another (the reference);
- ``disaggregated``: envs in worker processes/actors, all stepped together each step;
- ``hybrid``: envs in workers, the batch split into ``pipeline_stages`` groups so the
  workers simulate one group while the driver runs the policy on another;
- ``auto``: a short probe of simulator step time against policy inference time picks one.

Shard planning follows from the placement: the batch of ``num_envs`` envs is cut into *shards*,
the intersection of a contiguous split over workers with a contiguous split over pipeline groups
(``runtime.pipeline_stages``); each worker owns the shards of its slice.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, replace
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from rlinf_cli import settings
from rlinf_cli.runtime.codec import CODECS, CodecConfig

MODES = ("collocated", "disaggregated", "hybrid", "auto")
# Driver-side cost of one request/reply with a local worker (pipe, pickling, wake-up), measured
# on a 2-core machine; ``auto`` uses it to decide whether workers pay for themselves.
IPC_OVERHEAD_S = 150e-6


@dataclass(frozen=True)
class RuntimeConfig:
    mode: str = "collocated"  # collocated | disaggregated | hybrid | auto
    env_workers: int = 0  # worker processes/actors; 0 = one per CPU core (at most num_envs)
    pipeline_stages: int = 2  # hybrid: groups the env batch is split into
    shared_memory: bool | str = "auto"  # local workers put observations in shared memory
    start_method: str = "forkserver"  # how local workers start: forkserver | spawn | fork
    max_restarts: int = 3  # crashes recovered per env worker (each has its own budget); 0 = fail on the first
    worker_timeout_s: float = 300.0  # a worker silent this long counts as crashed
    overlap_update: bool = False  # rl: next rollout collected during the update (read by the rl stage)
    max_staleness: int = 0  # rl, generation workers: weight versions samples may lag (read by the text rollout)
    obs_compression: str = "none"  # none | lz4 | zstd (from env.obs_compression)
    obs_delta: bool = False  # XOR-delta for uint8 images (from env.obs_delta)
    compression_level: int = 1  # zstd level (from env.compression_level)
    infer_s: float | None = None  # policy inference time per batch step, measured by the stage (auto)

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"runtime.mode must be one of {', '.join(MODES)}, got '{self.mode}'")
        if self.pipeline_stages < 1 or self.env_workers < 0:
            raise ValueError("runtime.pipeline_stages must be >= 1 and runtime.env_workers >= 0")
        if self.max_staleness < 0:
            raise ValueError(f"runtime.max_staleness must be >= 0, got {self.max_staleness}")
        if self.start_method not in ("forkserver", "spawn", "fork"):
            raise ValueError(f"runtime.start_method must be forkserver, spawn or fork, got '{self.start_method}'")
        if self.obs_compression not in CODECS:
            raise ValueError(f"env.obs_compression must be one of {', '.join(CODECS)}, got '{self.obs_compression}'")
        if self.shared_memory not in (True, False, "auto"):
            raise ValueError(f"runtime.shared_memory must be true, false or auto, got {self.shared_memory!r}")

    @property
    def codec(self) -> CodecConfig:
        return CodecConfig(self.obs_compression, self.obs_delta, self.compression_level)


def runtime_config(data: Mapping[str, Any] | None) -> RuntimeConfig:
    """Build from an executor's ``runtime`` entry (absent = collocated, as before workers existed)."""
    return settings.build(RuntimeConfig, dict(data or {}), "runtime")


def cpu_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def num_workers(cfg: RuntimeConfig, num_envs: int) -> int:
    return max(1, min(num_envs, cfg.env_workers or cpu_cores()))


@dataclass(frozen=True)
class Choice:
    mode: str
    workers: int
    stages: int
    reason: str


def choose_mode(sim_s: float, infer_s: float, num_envs: int, cores: int, ipc_s: float = IPC_OVERHEAD_S,
                stages: int = 2) -> Choice:
    """Pick the mode with the shortest predicted time per batch step.

    ``sim_s``: stepping all ``num_envs`` envs once in one process; ``infer_s``: one policy
    call on the whole batch. Workers split ``sim_s`` over the cores but each request costs
    ``ipc_s`` in the driver; hybrid also overlaps inference with simulation, bounded by the
    total work spread over the cores. A simpler mode wins unless the other is 10% faster.
    """
    w = max(1, min(num_envs, cores))
    g = max(1, min(stages, num_envs))
    predicted = {
        "collocated": sim_s + infer_s,
        "disaggregated": sim_s / w + infer_s + ipc_s * w,
        "hybrid": max((sim_s + infer_s + ipc_s * w * g) / cores, sim_s / w + ipc_s * w, infer_s + ipc_s * w * g),
    }
    best = "collocated"
    for mode in ("disaggregated", "hybrid"):
        if num_envs >= 2 and cores >= 2 and predicted[mode] < 0.9 * predicted[best]:
            best = mode
    ms = ", ".join(f"{m} {predicted[m] * 1e3:.2f} ms" for m in predicted)
    reason = (f"runtime.mode=auto chose {best}: one batch step of {num_envs} envs takes {sim_s * 1e3:.2f} ms to simulate "
              f"and {infer_s * 1e3:.2f} ms to infer on {cores} core(s); predicted {ms}")
    return Choice(best, w if best != "collocated" else 0, g if best == "hybrid" else 1, reason)


def probe_sim(simulator: Any, num_envs: int, seconds: float = 0.5, max_envs: int = 2) -> float:
    """Seconds to step ``num_envs`` envs once, from a few envs stepped in this process."""
    from rlinf_cli.runtime.vector import SyncVecEnv

    n = max(1, min(num_envs, max_envs))
    env = SyncVecEnv(simulator, range(n), autoreset=True)
    try:
        env.reset(list(range(n)))
        spec = simulator.spec  # a discrete action has shape ()
        actions = np.zeros((n, *spec.action.shape), dtype=np.int64 if spec.discrete else np.float32)
        env.step(actions)  # first step can pay for lazy initialisation (renderers)
        steps, t0 = 0, time.perf_counter()
        while steps < 3 or (time.perf_counter() - t0 < seconds and steps < 500):
            env.step(actions)
            steps += 1
        per_env = (time.perf_counter() - t0) / (steps * n)
    finally:
        env.close()
    return per_env * num_envs


def time_inference(act: Callable[[dict[str, Any]], Any], spec: Any, num_envs: int, repeats: int = 20) -> float:
    """Median seconds of ``act(obs)`` on a zero observation batch of ``num_envs``."""
    from rlinf_cli.runtime.vector import alloc_obs

    import torch

    obs = alloc_obs(spec, num_envs)
    state = torch.get_rng_state()  # sampling here must not shift the run's random stream
    try:
        act(obs)
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            act(obs)
            times.append(time.perf_counter() - t0)
    finally:
        torch.set_rng_state(state)
    return float(np.median(times))


def resolve(cfg: RuntimeConfig, simulator: Any, num_envs: int) -> tuple[RuntimeConfig, Choice | None]:
    """Replace ``auto`` by a concrete mode (probing the simulator); other modes pass through."""
    if cfg.mode != "auto":
        return cfg, None
    from rlinf_cli.api import BatchedSimulator, HostedSimulator

    if isinstance(simulator, BatchedSimulator) and not isinstance(simulator, HostedSimulator):
        choice = Choice("collocated", 0, 1, "runtime.mode=auto: the simulator steps its envs as one batch of its own "
                        "engine, in this process (no env workers)")
        return replace(cfg, mode="collocated"), choice
    if isinstance(simulator, HostedSimulator):  # its envs run on servers: nothing here to probe
        choice = Choice("disaggregated", cfg.env_workers, 1, "runtime.mode=auto: the simulator's envs run on env "
                        "server(s), stepped synchronously (runtime.mode=hybrid pipelines them with inference)")
        return replace(cfg, mode="disaggregated"), choice
    choice = choose_mode(probe_sim(simulator, num_envs), cfg.infer_s or 0.0, num_envs, cpu_cores(),
                         stages=cfg.pipeline_stages)
    resolved = replace(cfg, mode=choice.mode, env_workers=choice.workers or cfg.env_workers,
                       pipeline_stages=choice.stages if choice.mode == "hybrid" else cfg.pipeline_stages)
    return resolved, choice


# -- shard planning -------------------------------------------------------------------------
@dataclass(frozen=True)
class Shard:
    lo: int  # first global env index
    hi: int  # one past the last
    group: int  # pipeline group
    worker: int  # worker that owns it


def plan_shards(num_envs: int, num_workers: int, num_groups: int) -> list[Shard]:
    """Intersect a contiguous split over workers with a contiguous split over groups."""
    def bounds(k: int) -> list[int]:
        sizes = [num_envs // k + (1 if i < num_envs % k else 0) for i in range(k)]
        return list(np.cumsum([0, *sizes]))

    wb, gb = bounds(num_workers), bounds(num_groups)
    shards = []
    for w in range(num_workers):
        for g in range(num_groups):
            lo, hi = max(wb[w], gb[g]), min(wb[w + 1], gb[g + 1])
            if lo < hi:
                shards.append(Shard(int(lo), int(hi), g, w))
    return shards


def plan_layout(rt: RuntimeConfig, num_envs: int) -> tuple[int, int, list[Shard]]:
    """``(workers, pipeline stages, shards)`` for a resolved :class:`RuntimeConfig`
    (every executor places envs the same way)."""
    workers = num_workers(rt, num_envs)
    stages = min(rt.pipeline_stages, num_envs) if rt.mode == "hybrid" else 1
    return workers, stages, plan_shards(num_envs, workers, stages)


def worker_shards(shards: Sequence[Shard], worker: int) -> list[tuple[int, int]]:
    """The ``(lo, hi)`` env ranges worker ``worker`` hosts, in shard order."""
    return [(s.lo, s.hi) for s in shards if s.worker == worker]
