"""Rollout env-steps/s, side by side in one run (medians over repeats):

- raw simulator stepping, no policy (the limit): in this process, and spread over worker
  processes (one per core) the way the worker modes spread it;
- rlinf ``Runner.collect_steps`` with an MLP (state) or CNN (pixels) policy in each
  ``runtime.mode``: collocated, disaggregated, hybrid, auto;
- gymnasium's ``AsyncVectorEnv`` (shared memory) over the same env instances, driven by the
  same policy in a plain loop.

    python benchmarks/rollout_throughput.py                      # HalfCheetah state + pixels
    python benchmarks/rollout_throughput.py --tasks InvertedPendulum-v5:rgb --repeats 5
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import machine_line, median, table  # noqa: E402


def make_sim(task: str) -> Any:
    from rlinf_cli.registry import make_simulator

    env_id, _, obs = task.partition(":")
    return make_simulator({"name": "gymnasium", "env_id": env_id, "obs": obs or "state"})


def make_policy(sim: Any) -> Any:
    import torch

    from rlinf_cli.registry import get_registry

    torch.manual_seed(0)
    keys = ["rgb"] if "rgb" in sim.spec.observation else ["state"]
    policy = get_registry().load("model", "mlp")({"name": "mlp", "obs_keys": keys}, sim.spec)
    return policy.eval()


def random_actions(spec: Any, n: int, rng: np.random.Generator) -> np.ndarray:
    if spec.discrete:
        return rng.integers(0, spec.num_actions, size=n)
    return rng.uniform(spec.action.low, spec.action.high, size=(n, *spec.action.shape)).astype(np.float32)


def time_raw(env: Any, spec: Any, n: int, steps: int) -> float:
    rng = np.random.default_rng(0)
    actions = [random_actions(spec, n, rng) for _ in range(16)]
    env.reset(list(range(n)))
    for t in range(4):
        env.step(actions[t % 16])
    t0 = time.perf_counter()
    for t in range(steps):
        env.step(actions[t % 16])
    return steps * n / (time.perf_counter() - t0)


def time_runner(env: Any, policy: Any, n: int, steps: int) -> float:
    from rlinf_cli.runtime.rollout import Runner

    runner = Runner(env, policy)
    runner.reset(list(range(n)))
    runner.collect_steps(4)
    t0 = time.perf_counter()
    runner.collect_steps(steps)
    return steps * n / (time.perf_counter() - t0)


class _GymAdapter:
    """One rlinf env instance as a gymnasium.Env (dict observation space), for AsyncVectorEnv."""

    def __init__(self, sim: Any, index: int):
        import gymnasium as gym
        from gymnasium import spaces

        self._gym = gym
        self.env = sim.make_env(index)
        spec = sim.spec
        self.observation_space = spaces.Dict({k: spaces.Box(0 if s.dtype == "uint8" else -np.inf,
                                                            255 if s.dtype == "uint8" else np.inf, s.shape, s.dtype)
                                              for k, s in spec.observation.items()})
        self.action_space = spaces.Box(spec.action.low, spec.action.high, spec.action.shape, np.float32)
        self.metadata: dict = {}
        self.render_mode = None
        self.spec = None
        self.np_random = None

    def reset(self, *, seed: int | None = None, options: Any = None) -> Any:
        return self.env.reset(seed=seed)

    def step(self, action: np.ndarray) -> Any:
        return self.env.step(action)

    def close(self) -> None:
        self.env.close()

    @property
    def unwrapped(self) -> Any:
        return self


def _adapter_factory(sim: Any, index: int) -> Callable[[], Any]:
    return lambda: _GymAdapter(sim, index)


def time_gym_async(sim: Any, policy: Any, n: int, steps: int) -> float:
    import torch
    from gymnasium.vector import AsyncVectorEnv

    from rlinf_cli.runtime.rollout import env_action

    venv = AsyncVectorEnv([_adapter_factory(sim, i) for i in range(n)], shared_memory=True, context="forkserver",
                          autoreset_mode="SameStep")
    try:
        obs, _ = venv.reset(seed=list(range(n)))
        with torch.no_grad():
            def step(o: Any) -> Any:
                out = policy.act({k: torch.as_tensor(v) for k, v in o.items()})
                return venv.step(env_action(sim.spec, out.action))[0]
            for _ in range(4):
                obs = step(obs)
            t0 = time.perf_counter()
            for _ in range(steps):
                obs = step(obs)
            return steps * n / (time.perf_counter() - t0)
    finally:
        venv.close()


def bench_task(task: str, args: argparse.Namespace) -> None:
    import torch

    from rlinf_cli.runtime.placement import cpu_cores
    from rlinf_cli.runtime.vector import SyncVecEnv
    from rlinf_executor_local.executor import LocalExecutor

    torch.set_num_threads(1)
    sim = make_sim(task)
    policy = make_policy(sim)
    n = args.envs
    pixels = "rgb" in sim.spec.observation
    steps = args.pixel_steps if pixels else args.state_steps
    workers = min(n, cpu_cores())
    results: dict[str, list[float]] = {}
    envs: dict[str, Any] = {
        "raw, 1 process": lambda: SyncVecEnv(sim, range(n)),
        f"raw, {workers} worker processes": lambda: LocalExecutor(
            {"name": "local", "runtime": {"mode": "disaggregated"}}).make_vec_env(sim, n, True),
    }
    modes = ["collocated", "disaggregated", "hybrid", "auto"]
    for r in range(args.repeats):
        for name, make in envs.items():
            env = make()
            try:
                results.setdefault(name, []).append(time_raw(env, sim.spec, n, steps))
            finally:
                env.close()
        for mode in modes:
            runtime: dict[str, Any] = {"mode": mode}
            if mode == "auto":
                from rlinf_cli.runtime.placement import time_inference
                from rlinf_cli.runtime.rollout import policy_actor

                runtime["infer_s"] = time_inference(policy_actor(policy, sim.spec, "cpu", False), sim.spec, n)
            ex = LocalExecutor({"name": "local", "runtime": runtime})
            env = ex.make_vec_env(sim, n, True)
            try:
                label = f"rlinf {mode}" + (f" -> {ex.choice.mode}" if ex.choice is not None else "")
                results.setdefault(label, []).append(time_runner(env, policy, n, steps))
            finally:
                env.close()
        if not args.no_gym:
            results.setdefault("gymnasium AsyncVectorEnv + policy", []).append(time_gym_async(sim, policy, n, steps))
    ref = median(results["rlinf collocated"])
    raw1 = median(results["raw, 1 process"])
    rawp = median(results[f"raw, {workers} worker processes"])
    rows = [[name, median(v), median(v) / ref, median(v) / raw1, median(v) / rawp,
             " ".join(f"{x:,.0f}" for x in v)] for name, v in results.items()]
    print(f"\n{task}: {n} envs, {steps} steps per measurement, {args.repeats} repeats (medians)")
    print(table(["", "env-steps/s", "x collocated", "x raw 1 proc", f"x raw {workers} procs", "per repeat"], rows))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tasks", default="HalfCheetah-v5:state,HalfCheetah-v5:rgb",
                   help="comma-separated env_id:obs (obs = state | rgb)")
    p.add_argument("--envs", type=int, default=8)
    p.add_argument("--state-steps", type=int, default=512)
    p.add_argument("--pixel-steps", type=int, default=48)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--no-gym", action="store_true", help="skip gymnasium AsyncVectorEnv")
    args = p.parse_args()
    os.environ.setdefault("MUJOCO_GL", "egl")
    print(machine_line())
    for task in args.tasks.split(","):
        bench_task(task, args)
    print("\nload after: " + machine_line().split("load average ")[1])


if __name__ == "__main__":
    main()
