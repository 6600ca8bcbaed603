"""Remote env server vs local env workers: env-steps/s side by side, in one run (medians of repeats).

The same simulator runs (a) in local env worker processes (``executor=local``,
``runtime.mode=disaggregated``) and (b) behind ``rlinf env serve`` on this machine, reached with
``sim=remote`` (one session per local worker, so both sides use the same number of simulator
processes). Envs are stepped with random actions (no policy), so the numbers isolate the
transport: pipes or shared memory locally, gRPC + msgpack + the server's relay remotely.
Pixels are measured with and without compression; local uncompressed pixels travel through shared
memory (what the local executor picks), remote ones as raw bytes. Repeats alternate local and
remote so that load from other processes hits both alike; the ratio is the median of the
per-repeat ratios.

    python benchmarks/remote_env.py                       # InvertedPendulum-v5 state and 84x84 pixels
    python benchmarks/remote_env.py --task Hopper-v5 --envs 8 --workers 2 --repeats 5
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import machine_line, median, table  # noqa: E402

CASES = [  # (label, observation mode, codec settings)
    ("state, no codec", "state", {}),
    ("pixels, no codec", "rgb", {}),
    ("pixels, lz4", "rgb", {"obs_compression": "lz4"}),
    ("pixels, lz4 + xor-delta", "rgb", {"obs_compression": "lz4", "obs_delta": True}),
]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(task: str, obs: str, port: int) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "rlinf_cli", "env", "serve", "sim=gymnasium", f"sim.env_id={task}", f"sim.obs={obs}",
           f"port={port}", "log_level=warning"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return proc
        if proc.poll() is not None:
            raise SystemExit(f"the env server did not start: {proc.stderr.read()}")
        time.sleep(0.2)
    proc.kill()
    raise SystemExit("the env server did not start within 120 s")


def measure(sim, runtime: dict, n: int, steps: int) -> float:
    from rlinf_executor_local.executor import LocalExecutor

    env = LocalExecutor({"name": "local", "runtime": runtime}).make_vec_env(sim, n, True)
    rng = np.random.default_rng(0)
    spec = sim.spec
    acts = [rng.uniform(spec.action.low, spec.action.high, size=(n, *spec.action.shape)).astype(np.float32)
            for _ in range(16)]
    try:
        env.reset(list(range(n)))
        for t in range(3):  # renderers and codecs warm up
            env.step(acts[t])
        t0 = time.perf_counter()
        for t in range(steps):
            env.step(acts[t % 16])
        wall = time.perf_counter() - t0
    finally:
        env.close()
    return steps * n / wall


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--task", default="InvertedPendulum-v5", help="gymnasium MuJoCo env id (pixels need MuJoCo)")
    p.add_argument("--envs", type=int, default=8)
    p.add_argument("--workers", type=int, default=2, help="local worker processes = remote sessions")
    p.add_argument("--steps", type=int, default=60, help="batch steps per measurement")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--mode", default="disaggregated", choices=["disaggregated", "hybrid"],
                   help="runtime.mode on both sides (hybrid: 2 pipeline groups, stepped synchronously here)")
    args = p.parse_args()
    os.environ.setdefault("MUJOCO_GL", "egl")
    from rlinf_cli.registry import make_simulator
    from rlinf_sim_remote.sim import RemoteSimulator

    print(machine_line())
    print(f"{args.task}: {args.envs} envs, {args.workers} local worker processes vs {args.workers} sessions on an env "
          f"server on this machine, runtime.mode={args.mode}, {args.steps} batch steps x {args.repeats} repeats, "
          f"random actions")
    rows = []
    for label, obs, codec in CASES:
        port = free_port()
        server = start_server(args.task, obs, port)
        try:
            local_sim = make_simulator({"name": "gymnasium", "env_id": args.task, "obs": obs})
            remote_sim = RemoteSimulator({"address": f"127.0.0.1:{port}", "sessions_per_server": args.workers})
            runtime = {"mode": args.mode, "env_workers": args.workers, **codec}
            local, remote = [], []
            for _ in range(args.repeats):
                local.append(measure(local_sim, runtime, args.envs, args.steps))
                remote.append(measure(remote_sim, runtime, args.envs, args.steps))
        finally:
            server.terminate()
            server.wait(timeout=30)
        ratio = median([r / l for l, r in zip(local, remote)])
        rows.append([label, median(local), median(remote), f"{ratio:.2f}"])
        print(f"  {label}: local {median(local):,.0f}, remote {median(remote):,.0f} env-steps/s", flush=True)
    print()
    print(table(["observations", "local workers env-steps/s", "remote env-steps/s", "remote / local"], rows))
    lz4 = next(r for r in rows if r[0] == "pixels, lz4")
    verdict = "meets" if float(lz4[3]) >= 0.8 else "MISSES"
    print(f"\nbar: remote keeps >= 80% of local env-worker throughput on pixels with lz4: {verdict} ({lz4[3]})")


if __name__ == "__main__":
    main()
