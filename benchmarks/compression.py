"""Observation transport: bytes moved and env-steps/s for none/lz4/zstd, with and without XOR-delta,
side by side in one run (medians over repeats).

Envs run in worker processes (``runtime.mode=disaggregated``) and are stepped with random actions
(no policy), so the numbers isolate transport: bytes crossing the process boundary per env step,
codec time (encode in the worker + decode in the driver) per env step, and env-steps/s. The
shared-memory row is what the local executor uses for uncompressed pixels; compression pays off
between machines (the Ray executor), where bytes cost more than CPU.

    python benchmarks/compression.py --tasks InvertedPendulum-v5:rgb,HalfCheetah-v5:rgb --repeats 3
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import machine_line, median, table  # noqa: E402

SETTINGS = [
    ("shared memory (no codec)", {"shared_memory": True}),
    ("none (pickled through the pipe)", {"shared_memory": False}),
    ("lz4", {"obs_compression": "lz4"}),
    ("lz4 + xor-delta", {"obs_compression": "lz4", "obs_delta": True}),
    ("zstd", {"obs_compression": "zstd"}),
    ("zstd + xor-delta", {"obs_compression": "zstd", "obs_delta": True}),
]


def measure(sim, runtime: dict, n: int, steps: int) -> dict:
    from rlinf_executor_local.executor import LocalExecutor

    env = LocalExecutor({"name": "local", "runtime": {"mode": "disaggregated", **runtime}}).make_vec_env(sim, n, True)
    rng = np.random.default_rng(0)
    spec = sim.spec
    acts = [rng.uniform(spec.action.low, spec.action.high, size=(n, *spec.action.shape)).astype(np.float32)
            for _ in range(16)]
    try:
        env.reset(list(range(n)))
        for t in range(3):
            env.step(acts[t])
        totals: dict[str, float] = {}
        t0 = time.perf_counter()
        for t in range(steps):
            sb = env.step(acts[t % 16])
            for k, v in sb.stats.items():
                totals[k] = totals.get(k, 0.0) + v
        wall = time.perf_counter() - t0
    finally:
        env.close()
    env_steps = steps * n
    return {"raw": totals.get("transport/obs_bytes_raw", 0.0) / env_steps,
            "sent": totals.get("transport/obs_bytes", 0.0) / env_steps,
            "codec_ms": (totals.get("transport/encode_s", 0.0) + totals.get("transport/decode_s", 0.0)) / env_steps * 1e3,
            "sps": env_steps / wall}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tasks", default="InvertedPendulum-v5:rgb,HalfCheetah-v5:rgb")
    p.add_argument("--envs", type=int, default=8)
    p.add_argument("--steps", type=int, default=48)
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args()
    os.environ.setdefault("MUJOCO_GL", "egl")
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from rollout_throughput import make_sim

    print(machine_line())
    for task in args.tasks.split(","):
        sim = make_sim(task)
        runs: dict[str, list[dict]] = {name: [] for name, _ in SETTINGS}
        for _ in range(args.repeats):
            for name, runtime in SETTINGS:
                runs[name].append(measure(sim, runtime, args.envs, args.steps))
        rows = []
        base_sps = median([r["sps"] for r in runs[SETTINGS[0][0]]])
        for name, rs in runs.items():
            raw, sent = median([r["raw"] for r in rs]), median([r["sent"] for r in rs])
            sps = median([r["sps"] for r in rs])
            rows.append([name, raw, sent, raw / sent if sent else float("nan"), median([r["codec_ms"] for r in rs]),
                         sps, sps / base_sps])
        print(f"\n{task}: {args.envs} envs in worker processes, {args.steps} steps x {args.repeats} repeats (medians), "
              "per env step:")
        print(table(["transport", "obs bytes", "bytes moved", "x fewer", "codec ms", "env-steps/s", "x shm"], rows))
    print("\nload after: " + machine_line().split("load average ")[1])


if __name__ == "__main__":
    main()
