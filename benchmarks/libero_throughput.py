"""LIBERO env-steps/s: LIBERO's own env (robosuite rendering its two cameras) vs rlinf's LIBERO env
(the lean EGL renderer), plus physics alone, side by side in one run. Random actions, one core.

    .venv/bin/python benchmarks/libero_throughput.py [--suite spatial] [--steps 100] [--size 128] [--repeats 3]

Needs `make libero`. Prints medians over repeats and each row's ratio to LIBERO's own env.
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np

from _common import machine_line, median, table


def _time_steps(step, n: int, rng: np.random.Generator) -> float:
    t0 = time.perf_counter()
    for _ in range(n):
        step(np.concatenate([rng.uniform(-1, 1, 6), [rng.choice([-1.0, 1.0])]]))
    return n / (time.perf_counter() - t0)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--suite", default="spatial")
    p.add_argument("--task", type=int, default=0)
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--size", type=int, default=128)
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args()
    os.environ.setdefault("MUJOCO_GL", "egl")

    import torch

    torch.set_num_threads(1)
    from libero.libero.envs import OffScreenRenderEnv

    from rlinf_sim_libero import backend
    from rlinf_sim_libero.sim import LiberoSimulator

    def rlinf_env(wrist: bool):
        sim = LiberoSimulator({"suite": args.suite, "tasks": [args.task], "image_size": args.size, "wrist": wrist})
        env = sim.make_env(0)
        env.reset(seed=0)
        return sim, env

    sim, _ = rlinf_env(True)
    task = sim.tasks[0]
    api = backend.load_api()
    with backend.quiet():
        state = api.benchmark.get_benchmark_dict()[sim.suite]().get_task_init_states(task.index)[0]

    native = OffScreenRenderEnv(bddl_file_name=task.bddl_file, camera_heights=args.size, camera_widths=args.size,
                                hard_reset=False, ignore_done=True)
    native.reset()
    native.set_init_state(state)
    physics = backend.make_raw_env(api, task.bddl_file)
    physics.reset()
    physics.set_init_state(state)
    _, two = rlinf_env(True)
    _, one = rlinf_env(False)

    cases = {
        "LIBERO OffScreenRenderEnv (robosuite renders agentview + wrist)": native.step,
        "rlinf sim=libero (agentview + wrist)": two.step,
        "rlinf sim=libero sim.wrist=false (agentview)": one.step,
        "physics only (no camera)": physics.step,
    }
    rates: dict[str, list[float]] = {k: [] for k in cases}
    rng = np.random.default_rng(0)
    for _ in range(args.repeats):  # interleaved, so load changes hit every row alike
        for name, step in cases.items():
            rates[name].append(_time_steps(step, args.steps, rng))
    base = median(rates[next(iter(cases))])
    rows = [(name, median(r), median(r) / base) for name, r in rates.items()]
    print(f"LIBERO {sim.suite} task {task.index} ({task.name}), {args.size}x{args.size} images, "
          f"{args.steps} random steps x {args.repeats} repeats, MUJOCO_GL={os.environ.get('MUJOCO_GL')}")
    print(machine_line())
    print(table(["env", "steps/s (median)", "vs LIBERO's env"], rows))
    for env in (native, physics):
        env.close()
    two.close()
    one.close()


if __name__ == "__main__":
    main()
