"""Milliseconds per SAC gradient step: rlinf (fp32 and ``train.bf16=true``) vs Stable-Baselines3.

``train.bf16=true`` is timed in both of the engine's forms where this CPU's oneDNN has bf16 kernels:
oneDNN's bf16 math on fp32 tensors (what the engine picks for an MLP on such a CPU) and autocast
(what it picks elsewhere).

The settings of ``benchmarks/mujoco_vs_sb3.py`` (batch 256, 256x256 ReLU (``--hidden``), twin Q, automatic
temperature, lr 3e-4) on a task's observation and action sizes, one thread, in one process.
A gradient step here is what each library's training loop does per env step once learning has
started, without the env step: rlinf's ``update_transitions`` (sample from its replay buffer
through the runtime's replay ``sample`` (runtime/batches.py), forward, backward, Adam, Polyak) and SB3's
``SAC.train(gradient_steps=1)`` (the same, through its own replay buffer). Both buffers hold the
same random transitions. The variants run in interleaved blocks, in a shuffled order each
round, so that load drifts hit all of them; printed: the median over blocks (many short blocks:
this VM's speed drifts by 30% within minutes).

    python benchmarks/sac_step.py --task Hopper-v5 --steps 50 --blocks 30
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import time
import types
from pathlib import Path
from typing import Any, Callable

os.environ.setdefault("OMP_NUM_THREADS", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import machine_line, median, table  # noqa: E402

import gymnasium as gym  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402

FILL = 20_000  # random transitions in both replay buffers


def random_transitions(obs_dim: int, act_dim: int, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {"obs": rng.normal(size=(FILL, obs_dim)).astype(np.float32),
            "next_obs": rng.normal(size=(FILL, obs_dim)).astype(np.float32),
            "actions": rng.uniform(-1, 1, size=(FILL, act_dim)).astype(np.float32),
            "rewards": rng.normal(size=FILL).astype(np.float32),
            "terminated": rng.random(FILL) < 0.01}


def rlinf_stepper(task: str, data: dict[str, np.ndarray], bf16: bool, seed: int,
                  hidden: list[int], autocast: bool = False) -> Callable[[int], None]:
    """``run(n)``: n gradient steps through rlinf's own update loop and replay sampling."""
    from rlinf_algos.sac import SAC, SACConfig

    from rlinf_cli.api import ArraySpec, EnvSpec
    from rlinf_cli.registry import get_registry
    from rlinf_cli.runtime.batches import ReplayStore, SampleBatches
    from rlinf_cli.runtime.engine import make_engine
    from rlinf_cli.runtime.replay import ReplayBuffer
    from rlinf_cli.runtime.update import update_transitions

    env = gym.make(task)
    low, high = float(env.action_space.low.min()), float(env.action_space.high.max())
    spec = EnvSpec(observation={"state": ArraySpec(env.observation_space.shape, "float32")},
                   action=ArraySpec(env.action_space.shape, "float32", low=low, high=high), max_episode_steps=1000)
    torch.manual_seed(seed)
    algo = SAC(SACConfig(minibatch_size=256, lr=3e-4, utd=1.0, warmup_steps=0, init_temperature=1.0))
    algo.check(spec)
    model_cfg = {"name": "mlp", "hidden_sizes": hidden, "activation": "relu", "ortho_init": False,
                 **algo.model_options()}
    policy = get_registry().load("model", "mlp")(model_cfg, spec)
    engine = make_engine(policy, algo.optim, {"backend": "torch", "bf16": bf16})
    if autocast:  # the engine's other form of train.bf16 (GPUs, convolutions)
        engine.onednn_bf16 = False
    replay = ReplayBuffer(spec, ["state"], capacity=FILL)
    replay.add({"state": data["obs"]}, data["actions"], data["rewards"], {"state": data["next_obs"]},
               data["terminated"])
    # the runtime's own replay batches, on a store holding the filled buffer
    spec_rollout = algo.rollout_spec()
    batches = SampleBatches(torch.device("cpu"), ReplayStore(replay=replay, batch_size=spec_rollout.batch_size,
                                                             demo_fraction=spec_rollout.demo_fraction))
    generator = torch.Generator().manual_seed(seed)

    def run(n: int) -> None:
        batches.collected = lambda: FILL + n
        update_transitions(engine, algo, types.SimpleNamespace(env_steps=n), batches, generator)

    return run


def sb3_stepper(task: str, data: dict[str, np.ndarray], seed: int, hidden: list[int]) -> Callable[[int], None]:
    from stable_baselines3 import SAC as SB3SAC
    from stable_baselines3.common.logger import configure

    model = SB3SAC("MlpPolicy", gym.make(task), learning_rate=3e-4, buffer_size=FILL, learning_starts=0,
                   batch_size=256, tau=0.005, gamma=0.99, train_freq=1, gradient_steps=1, ent_coef="auto_1.0",
                   seed=seed, device="cpu", verbose=0, policy_kwargs=dict(net_arch=hidden))
    model.set_logger(configure(None, []))  # train() logs; no output formats
    buf = model.replay_buffer
    n = FILL
    buf.observations[:n, 0] = data["obs"]
    buf.next_observations[:n, 0] = data["next_obs"]
    buf.actions[:n, 0] = data["actions"]
    buf.rewards[:n, 0] = data["rewards"]
    buf.dones[:n, 0] = data["terminated"]
    buf.timeouts[:n, 0] = False
    buf.pos, buf.full = 0, True

    def run(steps: int) -> None:
        for _ in range(steps):
            model.train(gradient_steps=1, batch_size=256)

    return run


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--task", default="Hopper-v5")
    p.add_argument("--steps", type=int, default=50, help="gradient steps per timed block")
    p.add_argument("--blocks", type=int, default=30, help="timed blocks per variant (median reported)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--hidden", default="256,256", help="hidden layer widths of actor and critics")
    args = p.parse_args()
    torch.set_num_threads(1)
    hidden = [int(h) for h in args.hidden.split(",")]
    env = gym.make(args.task)
    data = random_transitions(env.observation_space.shape[0], env.action_space.shape[0], args.seed)
    print(machine_line())
    from rlinf_cli.runtime.precision import onednn_bf16_available

    variants: dict[str, Callable[[int], None]] = {
        "rlinf fp32": rlinf_stepper(args.task, data, False, args.seed, hidden),
        "rlinf bf16 (train.bf16=true)": rlinf_stepper(args.task, data, True, args.seed, hidden),
        "sb3 fp32": sb3_stepper(args.task, data, args.seed, hidden),
    }
    if onednn_bf16_available():
        variants["rlinf bf16 as autocast"] = rlinf_stepper(args.task, data, True, args.seed, hidden, autocast=True)
    for run in variants.values():  # warm-up: first-call allocations, oneDNN kernel selection
        run(20)
    ms: dict[str, list[float]] = {k: [] for k in variants}
    order = random.Random(args.seed)
    for _ in range(args.blocks):
        names = list(variants)
        order.shuffle(names)  # no variant always runs after the same one (caches, clock drift)
        for name in names:
            run = variants[name]
            t0 = time.perf_counter()
            run(args.steps)
            ms[name].append((time.perf_counter() - t0) * 1000 / args.steps)
    sb3 = median(ms["sb3 fp32"])
    rows: list[list[Any]] = [[name, median(v), min(v), max(v), sb3 / median(v)] for name, v in ms.items()]
    print(f"{args.task}, batch 256, {'x'.join(map(str, hidden))}, {args.blocks} blocks x {args.steps} "
          f"gradient steps, 1 thread")
    print(table(["variant", "ms/step (median)", "min", "max", "speed-up vs sb3"], rows))
    print("load after: " + machine_line().split("load average ")[1])


if __name__ == "__main__":
    main()
