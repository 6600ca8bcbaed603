"""MountainCarContinuous-v0 with rlinf's PPO defaults: running normalization on (the default,
``env.normalize_*=auto``) vs off, side by side, several seeds.

The task pays +100 for reaching the flag and -0.1 a^2 per step. Without normalization PPO learns
that not pushing costs least and never reaches the flag (return ~0); with rewards scaled by the
running std of the discounted return the rare +100 dominates the first updates and the policy
learns to swing up. Each run: ``rlinf rl sim.env_id=MountainCarContinuous-v0 total_steps=N
seed=S`` (everything else at its default: PPO, 8 envs x 128 steps, 64x64 tanh), then the run's
own final evaluation on ``--episodes`` deterministic held-out episodes (seeds 1,000,000 + i,
never used in training). Solved = return > 90. Prints per-seed returns, medians and wall times.

    python benchmarks/mountaincar.py --seeds 3 --steps 150000 --episodes 50
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import machine_line, median, run_stage, table  # noqa: E402

SETTINGS = {
    "default (normalization auto: on)": [],
    "normalization off": ["env.normalize_obs=false", "env.normalize_reward=false"],
}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--steps", type=int, default=150_000)
    p.add_argument("--episodes", type=int, default=50, help="held-out evaluation episodes per run")
    p.add_argument("--extra", nargs="*", default=[], help="more overrides for every run (key=value)")
    args = p.parse_args()
    print(machine_line(), flush=True)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name, overrides in SETTINGS.items():
            returns, walls = [], []
            for seed in range(args.seeds):
                run = Path(tmp) / f"{len(rows)}-{seed}"
                res = run_stage(["rl", "sim.env_id=MountainCarContinuous-v0", f"total_steps={args.steps}", f"seed={seed}",
                                 f"eval.episodes={args.episodes}", "tracking.enabled=false", "progress=false",
                                 "quiet=true", *overrides, *args.extra, f"run_dir={run}"], Path(tmp) / "log.txt")
                returns.append(float(res["eval"]["return_mean"]))
                walls.append(float(res["wall_s"]))
                print(f"{name} seed {seed}: return {returns[-1]:.2f} ({walls[-1]:.0f} s)", flush=True)
            solved = sum(r > 90 for r in returns)
            rows.append([name, ", ".join(f"{r:.2f}" for r in returns), median(returns), f"{solved}/{len(returns)}",
                         median(walls)])
    print()
    print(table(["PPO, MountainCarContinuous-v0", f"return per seed ({args.episodes} held-out episodes)",
                 "median", "solved (> 90)", "median wall s"], rows))
    print(f"\n{args.steps} env steps per run; command: rlinf rl sim.env_id=MountainCarContinuous-v0 "
          f"total_steps={args.steps} seed=S {' '.join(args.extra)}".rstrip())


if __name__ == "__main__":
    main()
