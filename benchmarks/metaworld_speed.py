"""Meta-World simulator speed, side by side in one process: what rlinf-sim-metaworld changes.

1. env step (random actions): Meta-World's own helpers vs the plugin's exact vectorised ones
   (rlinf_sim_metaworld/fast.py: contact check and quaternions);
2. pixels at 84x84: `env.render()` (Meta-World's renderer) vs the plugin's FastRenderer;
3. env creation: `gym.make("Meta-World/MT1", ...)` vs the plugin's (first build, then from the pool);
4. action chunks from pixels (K=4, 84x84, what model=vla model.head=chunk runs): every inner step
   rendered vs only the chunk's last (the env's `step_unobserved`, rlinf_cli/runtime/chunking.py).

Each number is the median of --repeats measurements, alternating the variants so that load from
other processes hits both alike. Prints ratios.

    python benchmarks/metaworld_speed.py [--tasks push-v3 pick-place-v3] [--steps 300] [--repeats 5]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

os.environ.setdefault("MUJOCO_GL", "egl")

import numpy as np  # noqa: E402


def step_rate(env, steps: int, rng: np.random.Generator) -> float:
    env.reset(seed=int(rng.integers(1000)))
    actions = rng.uniform(-1, 1, size=(steps, 4)).astype(np.float32)
    t0 = time.perf_counter()
    for a in actions:
        _, _, term, trunc, _ = env.step(a)
        if term or trunc:
            env.reset()
    return steps / (time.perf_counter() - t0)


def set_fast(env, on: bool) -> None:
    """Switch the plugin's fast helpers on or off (both are exact; only speed differs)."""
    from scipy.spatial.transform import Rotation

    from rlinf_sim_metaworld import fast

    raw = env._env
    if on:
        raw.touching_object = fast.touching_object.__get__(raw)
    else:
        raw.__dict__.pop("touching_object", None)
    for name, module in list(sys.modules.items()):
        if name.startswith("metaworld.envs.") and getattr(module, "Rotation", None) is not None:
            module.Rotation = fast._MatrixQuat if on else Rotation


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tasks", nargs="+", default=["reach-v3", "push-v3", "pick-place-v3", "door-open-v3"])
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--frames", type=int, default=100)
    p.add_argument("--repeats", type=int, default=5)
    a = p.parse_args()
    import gymnasium as gym
    import metaworld  # noqa: F401  (registers Meta-World/MT1)

    from rlinf_sim_metaworld.render import FastRenderer
    from rlinf_sim_metaworld.sim import MetaWorldSimulator, _create

    rng = np.random.default_rng(0)
    print(f"{'task':16s} {'step/s metaworld':>17s} {'step/s plugin':>14s} {'ratio':>6s}")
    for task in a.tasks:
        env = MetaWorldSimulator({"task": task}).make_env(0)
        env.reset(seed=0)
        base, fast = [], []
        for _ in range(a.repeats):
            set_fast(env, False)
            base.append(step_rate(env, a.steps, rng))
            set_fast(env, True)
            fast.append(step_rate(env, a.steps, rng))
        b, f = statistics.median(base), statistics.median(fast)
        print(f"{task:16s} {b:17.0f} {f:14.0f} {f / b:5.2f}x", flush=True)
        env.close()

    task = a.tasks[0]
    mw = gym.make("Meta-World/MT1", env_name=task, seed=0, render_mode="rgb_array", camera_name="corner",
                  width=84, height=84)
    mw.reset()
    raw = _create(task)
    raw.reset()
    ours = FastRenderer(raw.model, "corner", 84, 84)
    slow_fps, fast_fps = [], []
    for _ in range(a.repeats):
        t0 = time.perf_counter()
        for _ in range(max(a.frames // 10, 5)):
            mw.render()
        slow_fps.append(max(a.frames // 10, 5) / (time.perf_counter() - t0))
        t0 = time.perf_counter()
        for _ in range(a.frames):
            ours.render(raw.data)
        fast_fps.append(a.frames / (time.perf_counter() - t0))
    s, f = statistics.median(slow_fps), statistics.median(fast_fps)
    print(f"\nrender 84x84 corner ({task}): env.render() {s:.0f} frames/s, FastRenderer {f:.0f} frames/s: {f / s:.1f}x")
    ours.close()
    mw.close()

    make_mt1, make_ours, reuse = [], [], []
    sim = MetaWorldSimulator({"task": task})
    for _ in range(a.repeats):
        t0 = time.perf_counter()
        gym.make("Meta-World/MT1", env_name=task, seed=0).close()
        make_mt1.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        _create(task).close()
        make_ours.append(time.perf_counter() - t0)
        env = sim.make_env(0)
        env.reset(seed=0)
        env.close()  # back to the pool
        t0 = time.perf_counter()
        env = sim.make_env(1)
        env.reset(seed=0)
        reuse.append(time.perf_counter() - t0)
        env.close()
    m1, m2, m3 = (statistics.median(x) for x in (make_mt1, make_ours, reuse))
    print(f"env creation ({task}): gym.make MT1 {m1:.2f} s, plugin first build {m2:.2f} s ({m1 / m2:.1f}x), "
          f"from the pool incl. reset {m3 * 1000:.0f} ms ({m1 / m3:.0f}x)")

    from rlinf_cli.runtime.chunking import ChunkedEnv

    class EveryStepObserved:  # hides step_unobserved: what chunks cost before it existed
        def __init__(self, env):
            self.env = env

        def reset(self, **kw):
            return self.env.reset(**kw)

        def step(self, action):
            return self.env.step(action)

    pixels = MetaWorldSimulator({"task": task, "obs": "state_rgb", "image_size": 84})
    every, last = ChunkedEnv(EveryStepObserved(pixels.make_env(0)), 4), ChunkedEnv(pixels.make_env(1), 4)
    chunks = rng.uniform(-1, 1, size=(max(a.steps // 4, 10), 4, 4)).astype(np.float32)
    rates: dict[str, list[float]] = {"every": [], "last": []}
    for _ in range(a.repeats):
        for name, env in (("every", every), ("last", last)):
            env.reset(seed=0)
            t0 = time.perf_counter()
            for c in chunks:
                _, _, term, trunc, _ = env.step(c)
                if term or trunc:
                    env.reset()
            rates[name].append(4 * len(chunks) / (time.perf_counter() - t0))
    e, lst = statistics.median(rates["every"]), statistics.median(rates["last"])
    print(f"chunks of 4 from pixels 84x84 ({task}): every step rendered {e:.0f} env-steps/s, "
          f"the chunk's last only {lst:.0f} env-steps/s: {lst / e:.2f}x")


if __name__ == "__main__":
    main()
