"""Milliseconds per PPO update phase (1,024 samples, 10 epochs, minibatch 256): rlinf vs Stable-Baselines3.

The settings of ``benchmarks/mujoco_vs_sb3.py``'s PPO (64x64 tanh actor and critic, Gaussian
actions, lr 3e-4, max grad norm 0.5, value coefficient 0.5 of the MSE, no value clipping, no dual
clip) on a task's observation and action sizes, one thread, in one process. rlinf's update is
``runtime/update.py``'s ``update`` on an ``Experience`` of random data through the embodied
runtime's own minibatching (runtime/batches.py); SB3's is ``PPO.train()`` on a rollout buffer holding the same data.
rlinf runs with its defaults and, for comparison, with the MLP's fused networks
(``model.fast_grad``) and PPO's fused loss (``algo.fused_loss``) off. The variants run in
interleaved blocks, in a shuffled order each round (this VM's speed drifts by 30% within
minutes); printed: the median over blocks.

    python benchmarks/ppo_update.py --task Ant-v5 --blocks 15
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import time
from pathlib import Path
from typing import Any, Callable

os.environ.setdefault("OMP_NUM_THREADS", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import machine_line, median, table  # noqa: E402

import gymnasium as gym  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402

T, N = 128, 8  # steps per env x envs: one rollout of mujoco_vs_sb3.py's PPO


def random_rollout(obs_dim: int, act_dim: int, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {"obs": rng.normal(size=(T, N, obs_dim)).astype(np.float32),
            "actions": rng.normal(size=(T, N, act_dim)).astype(np.float32),
            "logprobs": rng.normal(-act_dim, 1.0, size=(T, N)).astype(np.float32),
            "values": rng.normal(size=(T, N)).astype(np.float32),
            "rewards": rng.normal(size=(T, N)).astype(np.float32),
            "dones": (rng.random((T, N)) < 0.02).astype(np.float32)}


def rlinf_updater(spec_env: Any, data: dict[str, np.ndarray], seed: int, fast: bool) -> Callable[[], None]:
    from rlinf_algos.ppo import PPO

    from rlinf_cli.api import ArraySpec, EnvSpec
    from rlinf_cli.experience import Experience
    from rlinf_cli.registry import get_registry
    from rlinf_cli.runtime.batches import SampleBatches
    from rlinf_cli.runtime.engine import make_engine
    from rlinf_cli.runtime.update import update

    spec = EnvSpec(observation={"state": ArraySpec(spec_env.observation_space.shape, "float32")},
                   action=ArraySpec(spec_env.action_space.shape, "float32"), max_episode_steps=1000)
    torch.manual_seed(seed)
    algo = PPO.from_config({"minibatch_size": 256, "epochs": 10, "lr": 3e-4, "anneal_lr": False, "dual_clip": None,
                            "clip_value": None, "entropy_coef": 0.0, "value_coef": 1.0, "max_grad_norm": 0.5,
                            "fused_loss": fast})
    policy = get_registry().load("model", "mlp")({"name": "mlp", "hidden_sizes": [64, 64], "activation": "tanh",
                                                 "fast_grad": fast}, spec)
    engine = make_engine(policy, algo.optim, {"backend": "torch", "bf16": False})
    t = {k: torch.from_numpy(v) for k, v in data.items()}
    exp = Experience({"state": t["obs"]}, t["actions"], t["logprobs"], t["values"], t["rewards"], t["dones"],
                     torch.zeros(T, N), torch.ones(T, N), torch.zeros(N), env_steps=T * N)
    batches = SampleBatches()  # an embodied world's minibatching, on its own
    generator = torch.Generator().manual_seed(seed)
    return lambda: update(engine, algo, exp, batches, generator)


def sb3_updater(task: str, data: dict[str, np.ndarray], seed: int) -> Callable[[], None]:
    from stable_baselines3 import PPO as SB3PPO
    from stable_baselines3.common.env_util import make_vec_env
    from stable_baselines3.common.logger import configure

    model = SB3PPO("MlpPolicy", make_vec_env(task, n_envs=N, seed=seed), n_steps=T, batch_size=256, n_epochs=10,
                   learning_rate=3e-4, gamma=0.99, gae_lambda=0.95, clip_range=0.2, ent_coef=0.0, vf_coef=0.5,
                   max_grad_norm=0.5, seed=seed, device="cpu", verbose=0,
                   policy_kwargs=dict(net_arch=dict(pi=[64, 64], vf=[64, 64]), activation_fn=torch.nn.Tanh))
    model.set_logger(configure(None, []))
    buf = model.rollout_buffer
    buf.observations[:] = data["obs"]
    buf.actions[:] = data["actions"]
    buf.log_probs[:] = data["logprobs"]
    buf.values[:] = data["values"]
    buf.rewards[:] = data["rewards"]
    buf.episode_starts[:] = data["dones"]
    buf.compute_returns_and_advantage(torch.zeros(N), np.zeros(N, dtype=bool))
    buf.full = True  # as collect_rollouts leaves it

    return model.train  # each epoch draws a fresh permutation of the (once flattened) buffer


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--task", default="Ant-v5")
    p.add_argument("--blocks", type=int, default=15, help="timed update phases per variant (median reported)")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    torch.set_num_threads(1)
    env = gym.make(args.task)
    data = random_rollout(env.observation_space.shape[0], env.action_space.shape[0], args.seed)
    print(machine_line())
    variants: dict[str, Callable[[], None]] = {
        "rlinf": rlinf_updater(env, data, args.seed, True),
        "rlinf, fast_grad=false fused_loss=false": rlinf_updater(env, data, args.seed, False),
        "sb3": sb3_updater(args.task, data, args.seed),
    }
    for run in variants.values():  # warm-up: first-call allocations, flat optimizer buffers
        run()
    ms: dict[str, list[float]] = {k: [] for k in variants}
    order = random.Random(args.seed)
    for _ in range(args.blocks):
        names = list(variants)
        order.shuffle(names)
        for name in names:
            t0 = time.perf_counter()
            variants[name]()
            ms[name].append((time.perf_counter() - t0) * 1000)
    sb3 = median(ms["sb3"])
    rows = [[name, median(v), min(v), max(v), sb3 / median(v)] for name, v in ms.items()]
    print(f"{args.task}, {T * N} samples x 10 epochs, minibatch 256, 64x64 tanh, {args.blocks} blocks, 1 thread")
    print(table(["variant", "ms/update (median)", "min", "max", "speed-up vs sb3"], rows))
    print("load after: " + machine_line().split("load average ")[1])


if __name__ == "__main__":
    main()
