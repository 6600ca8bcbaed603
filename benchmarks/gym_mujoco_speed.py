"""gymnasium MuJoCo locomotion, env steps/s through rlinf's simulator plugin: gymnasium's own step
(``sim.fast_step=false``) vs the plugin's fast step (rlinf_sim_gymnasium/fast.py, identical
observations and rewards), side by side in one process. Random actions, resets included; each
number is the median of --repeats blocks, alternating the two so that load hits both alike.

    python benchmarks/gym_mujoco_speed.py [--tasks Hopper-v5 Walker2d-v5 HalfCheetah-v5 Ant-v5] [--steps 3000] [--repeats 7]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import machine_line, table  # noqa: E402


def rate(env, actions: np.ndarray, seed: int) -> float:
    env.reset(seed=seed)
    t0 = time.perf_counter()
    for a in actions:
        _, _, term, trunc, _ = env.step(a)
        if term or trunc:
            env.reset()
    return len(actions) / (time.perf_counter() - t0)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tasks", nargs="+", default=["Hopper-v5", "Walker2d-v5", "HalfCheetah-v5", "Ant-v5"])
    p.add_argument("--steps", type=int, default=3000)
    p.add_argument("--repeats", type=int, default=7)
    args = p.parse_args()
    print(machine_line())
    from rlinf_sim_gymnasium.sim import GymnasiumSimulator

    rows = []
    for task in args.tasks:
        envs = {f: GymnasiumSimulator({"env_id": task, "fast_step": f}).make_env(0) for f in (False, True)}
        rng = np.random.default_rng(0)
        dim = envs[False].env.action_space.shape[0]
        rates: dict[bool, list[float]] = {False: [], True: []}
        for r in range(args.repeats):
            actions = rng.uniform(-1, 1, size=(args.steps, dim)).astype(np.float32)
            for f in ((False, True) if r % 2 == 0 else (True, False)):
                rates[f].append(rate(envs[f], actions, seed=r))
        slow, fast = statistics.median(rates[False]), statistics.median(rates[True])
        rows.append([task, f"{slow:,.0f}", f"{fast:,.0f}", f"{fast / slow:.2f}x"])
    print(table(["task", "gymnasium step/s", "fast step/s", "speed-up"], rows))


if __name__ == "__main__":
    main()
