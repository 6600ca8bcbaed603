"""rlinf PPO vs Stable-Baselines3 PPO at identical settings, side by side in one run.

Same gymnasium env, number of envs, rollout length, epochs, minibatch size, network (64x64
tanh actor and critic, orthogonal init, state-independent log std), Adam (lr 3e-4, eps 1e-5),
GAE, clip 0.2, unclipped value loss weighted 0.5 x MSE, gradient clip 0.5, constant learning
rate, advantages normalised per minibatch, 1 torch thread.
Each run is a fresh process; runs alternate (sb3, rlinf, sb3, ...) so load drifts hit both.

Training env-steps/s counts the training loop only (rollouts + updates: SB3's ``learn()``,
rlinf's ``time/rollout_s + time/update_s``), not start-up or the final evaluation. Final
return: 10 deterministic episodes on the same seeds (1000000 + i) for both.

    python benchmarks/ppo_vs_sb3.py --env InvertedPendulum-v5 --steps 150000 --repeats 3
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import machine_line, median, table  # noqa: E402

EVAL_SEED = 1_000_000


def sb3_worker(args: argparse.Namespace) -> None:
    """One SB3 run in this process; prints a JSON line."""
    import gymnasium as gym
    import numpy as np
    import torch
    from stable_baselines3 import PPO
    from stable_baselines3.common.env_util import make_vec_env

    torch.set_num_threads(1)
    env = make_vec_env(args.env, n_envs=args.envs, seed=args.seed)
    model = PPO("MlpPolicy", env, n_steps=args.n_steps, batch_size=args.batch, n_epochs=args.epochs, learning_rate=3e-4,
                gamma=0.99, gae_lambda=0.95, clip_range=0.2, clip_range_vf=None, ent_coef=0.0, vf_coef=0.5,
                max_grad_norm=0.5, normalize_advantage=True, seed=args.seed, device="cpu", verbose=0,
                policy_kwargs=dict(net_arch=dict(pi=[64, 64], vf=[64, 64]), activation_fn=torch.nn.Tanh,
                                   ortho_init=True, log_std_init=0.0))
    t0, c0 = time.perf_counter(), time.process_time()
    model.learn(total_timesteps=args.steps)
    train_s, cpu_s = time.perf_counter() - t0, time.process_time() - c0
    returns = []
    for i in range(10):
        e = gym.make(args.env)
        obs, _ = e.reset(seed=EVAL_SEED + i)
        done, ret = False, 0.0
        while not done:
            action, _ = model.predict(obs, deterministic=True)
            obs, r, term, trunc, _ = e.step(action)
            ret += float(r)
            done = term or trunc
        returns.append(ret)
    print(json.dumps({"env_steps": int(model.num_timesteps), "train_s": train_s, "cpu_s": cpu_s,
                      "return": float(np.mean(returns))}))


def run_sb3(args: argparse.Namespace, seed: int) -> dict:
    cmd = [sys.executable, __file__, "--sb3-worker", "--env", args.env, "--steps", str(args.steps), "--envs", str(args.envs),
           "--n-steps", str(args.n_steps), "--batch", str(args.batch), "--epochs", str(args.epochs), "--seed", str(seed)]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def run_rlinf(args: argparse.Namespace, seed: int, mode: str) -> dict:
    rlinf = str(Path(sys.executable).with_name("rlinf"))
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [rlinf, "rl", f"sim.env_id={args.env}", f"total_steps={args.steps}", f"num_envs={args.envs}",
               f"algo.rollout_steps={args.n_steps}", f"algo.minibatch_size={args.batch}", f"algo.epochs={args.epochs}",
               "algo.lr=3e-4", "algo.anneal_lr=false", "algo.dual_clip=null", "algo.clip_value=null",
               # rlinf's value loss is 0.5 * MSE (times value_coef); SB3's is vf_coef * MSE with vf_coef 0.5
               "algo.entropy_coef=0.0", "algo.max_grad_norm=0.5", "algo.value_coef=1.0", "model.hidden_sizes=[64,64]", "model.activation=tanh",
               f"seed={seed}", "eval.episodes=10", f"eval.seed={EVAL_SEED}", "tracking.enabled=false", "progress=false",
               "quiet=true", "checkpoint.interval=100000", f"run_dir={tmp}/run"]
        # "overlap": collocated envs, the next rollout collected during the update (one version behind)
        cmd += ["runtime.mode=collocated", "runtime.overlap_update=true"] if mode == "overlap" else [f"runtime.mode={mode}"]
        t0 = time.perf_counter()
        subprocess.run(cmd, capture_output=True, text=True, check=True, cwd=tmp)
        wall = time.perf_counter() - t0
        lines = [json.loads(x) for x in Path(tmp, "run", "metrics.jsonl").read_text().splitlines()]
        train_s = sum(m.get("time/rollout_s", 0.0) + m.get("time/update_s", 0.0) for m in lines)
        cpu_s = sum(m.get("time/cpu_s", 0.0) for m in lines)
        rollout_s = sum(m.get("time/rollout_s", 0.0) for m in lines)
        result = json.loads(Path(tmp, "run", "result.json").read_text())
    return {"env_steps": int(result["env_steps"]), "train_s": train_s, "cpu_s": cpu_s, "rollout_s": rollout_s, "wall_s": wall,
            "return": float(result["eval"]["return_mean"])}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--env", default="InvertedPendulum-v5")
    p.add_argument("--steps", type=int, default=150_000)
    p.add_argument("--envs", type=int, default=8)
    p.add_argument("--n-steps", type=int, default=128)
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--epochs", type=int, default=10)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--modes", default="collocated,overlap",
                   help="rlinf runtime.mode values to include, comma separated; 'overlap' = runtime.overlap_update=true")
    p.add_argument("--sb3-worker", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.sb3_worker:
        return sb3_worker(args)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    print(machine_line())
    print(f"{args.env}: {args.steps:,} steps, {args.envs} envs x {args.n_steps} steps, {args.epochs} epochs, "
          f"minibatch {args.batch}, {args.repeats} repeats (medians)")
    modes = [m for m in args.modes.split(",") if m]
    runs: dict[str, list[dict]] = {"sb3": [], **{f"rlinf {m}": [] for m in modes}}
    for r in range(args.repeats):
        seed = args.seed + r
        runs["sb3"].append(run_sb3(args, seed))
        for m in modes:
            runs[f"rlinf {m}"].append(run_rlinf(args, seed, m))
    base = median([x["env_steps"] / x["train_s"] for x in runs["sb3"]])
    base_cpu = median([x["env_steps"] / x["cpu_s"] for x in runs["sb3"]])
    rows = []
    for name, xs in runs.items():
        sps = median([x["env_steps"] / x["train_s"] for x in xs])
        cps = median([x["env_steps"] / x["cpu_s"] for x in xs])
        rows.append([name, sps, sps / base, cps, cps / base_cpu, median([x["return"] for x in xs]),
                     " ".join(f"{x['return']:.0f}" for x in xs)])
    print(table(["", "train env-steps/s", "x sb3", "per driver-CPU-s", "x sb3 (CPU)", "final return (median)",
                 "per repeat"], rows))
    print("per driver-CPU-s: env steps per CPU second of the training process (robust to other load; "
          "excludes other processes, so it flatters multi-process modes)")
    print(load_note())


def load_note() -> str:
    return "load after: " + machine_line().split("load average ")[1]


if __name__ == "__main__":
    main()
