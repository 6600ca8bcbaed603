"""Microseconds per ``MLPPolicy.act``: torch vs the numpy path (``model.fast_act``), side by side.

A rollout calls ``act`` once per step on one row per env; this times that call for a few batch
sizes and widths (Gaussian actor and value head, as PPO acts; ``--squash`` for SAC's actor),
in interleaved blocks (torch, numpy, torch, ...), one thread, and prints the medians and their
ratio. The numpy path's limit (rows x width^2 <= ``fast_act.MAX_WORK``) comes from this table; it is
timed here past that limit too.

    python benchmarks/fast_act.py --blocks 7
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import machine_line, median, table  # noqa: E402

import torch  # noqa: E402

from rlinf_cli.api import ArraySpec, EnvSpec  # noqa: E402
from rlinf_model_mlp.fast_act import MAX_WORK  # noqa: E402
from rlinf_model_mlp.model import MLPPolicy  # noqa: E402


def per_call_us(policy: MLPPolicy, obs: dict[str, torch.Tensor], fast: bool, calls: int) -> float:
    keep = policy._fast_act
    policy._fast_act = keep if fast else None
    limit = keep.max_rows
    keep.max_rows = 1 << 30  # time numpy past its limit too: the table is where the limit comes from
    try:
        with torch.no_grad():
            policy.act(obs)
            start = time.perf_counter()
            for _ in range(calls):
                policy.act(obs)
            return (time.perf_counter() - start) / calls * 1e6
    finally:
        policy._fast_act = keep
        keep.max_rows = limit


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--obs-dim", type=int, default=17, help="Hopper: 11, Walker2d/HalfCheetah: 17, Ant: 105")
    p.add_argument("--act-dim", type=int, default=6)
    p.add_argument("--batches", default="1,8,64,256")
    p.add_argument("--widths", default="64,256")
    p.add_argument("--calls", type=int, default=500, help="calls per timed block")
    p.add_argument("--blocks", type=int, default=7)
    p.add_argument("--squash", action="store_true", help="SAC's tanh-squashed actor (ReLU) instead of PPO's Gaussian")
    args = p.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    spec = EnvSpec({"state": ArraySpec((args.obs_dim,), "float32")}, ArraySpec((args.act_dim,), "float32", -1.0, 1.0))
    print(machine_line())
    rows = []
    for width in [int(w) for w in args.widths.split(",")]:
        cfg = {"hidden_sizes": [width, width], "activation": "relu" if args.squash else "tanh"}
        if args.squash:
            cfg.update(squash=True, q_heads=2, critic=False)
        policy = MLPPolicy(cfg, spec)
        for batch in [int(b) for b in args.batches.split(",")]:
            obs = {"state": torch.randn(batch, args.obs_dim)}
            times: dict[bool, list[float]] = {False: [], True: []}
            for _ in range(args.blocks):
                for fast in (False, True):
                    times[fast].append(per_call_us(policy, obs, fast, args.calls))
            t_torch, t_np = median(times[False]), median(times[True])
            rows.append([f"{width}x{width}", batch, f"{t_torch:.1f}", f"{t_np:.1f}", f"{t_torch / t_np:.2f}"])
    kind = "squashed Gaussian actor (SAC)" if args.squash else "Gaussian actor + value head (PPO)"
    print(f"numpy path used by act up to rows x width^2 <= {MAX_WORK:,} (fast_act.MAX_WORK); timed here at every size")
    print(f"{kind}, obs {args.obs_dim}, action {args.act_dim}, {args.blocks} blocks x {args.calls} calls, 1 thread")
    print(table(["networks", "batch", "torch us/act", "numpy us/act", "torch / numpy"], rows))


if __name__ == "__main__":
    main()
