"""rlinf vs Stable-Baselines3 on MuJoCo locomotion, PPO and SAC at identical settings, side by side.

For every seed, task and algorithm the two libraries run back to back (sb3, rlinf, sb3, ...), each
in a fresh process, so load drifts hit both; with ``--parallel`` the two processes of a (seed, task,
algorithm) run at the same time instead (one thread each, half the wall time), so both see the same
machine load. Printed per (task, algorithm): the final return
(mean over seeds of 10 deterministic held-out episodes, seeds 1000000 + i for both) and training
env-steps/s (the training loop only: SB3's ``learn()``, rlinf's ``time/rollout_s + time/update_s``),
with rlinf / SB3 ratios. Learning curves (episode returns during training against env steps, one
PNG per task) go to ``--out``.

PPO (both with running obs and reward normalization: SB3 ``VecNormalize``, rlinf
``env.normalize_obs/normalize_reward``): ``--envs`` envs x ``--n-steps``, minibatch 256, 10
epochs, lr 3e-4 constant, gamma 0.99, GAE 0.95, clip 0.2, no value clip, no entropy bonus,
gradient clip 0.5, 64x64 tanh actor and critic with orthogonal init, state-independent log std.

SAC: one env, ``--sac-warmup`` random steps, then one gradient step per env step, batch 256,
lr 3e-4 for actor, critics and temperature, gamma 0.99, tau 0.005, twin Q, automatic temperature
(initial 1, target -dim(A)), 256x256 ReLU networks with torch's default init, buffer
``--sac-buffer``, no normalization in either (rlinf's default would turn it on: set off here). Known differences: SB3 clamps the actor's log std to [-20, 2], rlinf bounds it
smoothly to [-5, 2]; SB3 steps three optimizers, rlinf one over the three disjoint losses.

Simulator: SB3 steps gymnasium's envs; rlinf's plugin steps Hopper, Walker2d, HalfCheetah and Ant
through its fast path (rlinf_sim_gymnasium/fast.py: the same observations, rewards and
terminations, less Python per step; ``--rlinf-set sim.fast_step=false`` for gymnasium's step).

    python benchmarks/mujoco_vs_sb3.py --tasks Hopper-v5,HalfCheetah-v5,Walker2d-v5,Ant-v5 \\
        --ppo-steps 300000 --sac-steps 100000 --seeds 2

``--rlinf-set KEY=VALUE`` (repeatable) adds an override to every rlinf run, e.g. ``train.bf16=true``
(bf16 autocast of the training matmuls) against the same SB3 settings.
"""

from __future__ import annotations

import argparse
import concurrent.futures
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
EVAL_EPISODES = 10


# -- Stable-Baselines3 (runs in a child process: --sb3-worker) --------------------------------------
def sb3_worker(args: argparse.Namespace) -> None:
    import gymnasium as gym
    import numpy as np
    import torch
    from stable_baselines3 import PPO, SAC
    from stable_baselines3.common.callbacks import BaseCallback
    from stable_baselines3.common.env_util import make_vec_env
    from stable_baselines3.common.vec_env import VecNormalize

    torch.set_num_threads(1)
    curve: list[tuple[int, float]] = []

    class Episodes(BaseCallback):
        def _on_step(self) -> bool:
            for info in self.locals.get("infos", []):
                if "episode" in info:
                    curve.append((int(self.num_timesteps), float(info["episode"]["r"]), 1.0))
            return True

    vecnorm = None
    if args.algo == "ppo":
        env = make_vec_env(args.task, n_envs=args.envs, seed=args.seed)
        env = vecnorm = VecNormalize(env, norm_obs=True, norm_reward=True, clip_obs=10.0, clip_reward=10.0, gamma=0.99)
        # --ppo-anneal-lr: SB3 calls the schedule with the fraction of the run left after each rollout
        lr = (lambda left: 3e-4 * left) if args.ppo_anneal_lr else 3e-4
        model = PPO("MlpPolicy", env, n_steps=args.n_steps, batch_size=256, n_epochs=10, learning_rate=lr, gamma=0.99,
                    gae_lambda=0.95, clip_range=0.2, clip_range_vf=None, ent_coef=0.0, vf_coef=0.5, max_grad_norm=0.5,
                    normalize_advantage=True, seed=args.seed, device="cpu", verbose=0,
                    policy_kwargs=dict(net_arch=dict(pi=[64, 64], vf=[64, 64]), activation_fn=torch.nn.Tanh,
                                       ortho_init=True, log_std_init=0.0))
    else:
        env = make_vec_env(args.task, n_envs=1, seed=args.seed)
        model = SAC("MlpPolicy", env, learning_rate=3e-4, buffer_size=args.buffer, learning_starts=args.warmup,
                    batch_size=256, tau=0.005, gamma=0.99, train_freq=1, gradient_steps=1, ent_coef="auto_1.0",
                    seed=args.seed, device="cpu", verbose=0, policy_kwargs=dict(net_arch=[256, 256]))
    t0, c0 = time.perf_counter(), time.process_time()
    model.learn(total_timesteps=args.steps, callback=Episodes())
    train_s, cpu_s = time.perf_counter() - t0, time.process_time() - c0
    returns = []
    for i in range(EVAL_EPISODES):
        e = gym.make(args.task)
        obs, _ = e.reset(seed=EVAL_SEED + i)
        done, ret = False, 0.0
        while not done:
            seen = vecnorm.normalize_obs(obs) if vecnorm is not None else obs  # frozen statistics
            action, _ = model.predict(seen, deterministic=True)
            obs, r, term, trunc, _ = e.step(action)
            ret += float(r)
            done = term or trunc
        returns.append(ret)
    print(json.dumps({"env_steps": int(model.num_timesteps), "train_s": train_s, "cpu_s": cpu_s,
                      "return": float(np.mean(returns)), "curve": curve}))


def run_sb3(args: argparse.Namespace, task: str, algo: str, seed: int) -> dict:
    steps = args.ppo_steps if algo == "ppo" else args.sac_steps
    cmd = [sys.executable, __file__, "--sb3-worker", "--task", task, "--algo", algo, "--steps", str(steps),
           "--envs", str(args.envs), "--n-steps", str(args.n_steps), "--warmup", str(args.sac_warmup),
           "--buffer", str(args.sac_buffer), "--seed", str(seed), *(["--ppo-anneal-lr"] if args.ppo_anneal_lr else [])]
    out = subprocess.run(cmd, capture_output=True, text=True)
    if out.returncode:
        raise SystemExit(f"sb3 {algo} {task} seed {seed} failed:\n{out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


# -- rlinf ------------------------------------------------------------------------------------------
def rlinf_args(args: argparse.Namespace, task: str, algo: str, seed: int) -> list[str]:
    common = [f"sim.env_id={task}", f"seed={seed}", f"eval.episodes={EVAL_EPISODES}", f"eval.seed={EVAL_SEED}",
              "tracking.enabled=false", "progress=false", "quiet=true", "checkpoint.interval=100000000"]
    if algo == "ppo":
        return common + [
            "algo=ppo", f"total_steps={args.ppo_steps}", f"num_envs={args.envs}", f"algo.rollout_steps={args.n_steps}",
            "algo.minibatch_size=256", "algo.epochs=10", "algo.lr=3e-4", f"algo.anneal_lr={str(args.ppo_anneal_lr).lower()}",
            "algo.gamma=0.99",
            "algo.gae_lambda=0.95", "algo.dual_clip=null", "algo.clip_value=null", "algo.entropy_coef=0.0",
            # rlinf's value loss is 0.5 * MSE (times value_coef); SB3's is vf_coef * MSE with vf_coef 0.5
            "algo.value_coef=1.0", "algo.max_grad_norm=0.5", "model.hidden_sizes=[64,64]", "model.activation=tanh",
            "env.normalize_obs=true", "env.normalize_reward=true", "env.normalize_gamma=0.99",
            "env.clip_obs=10.0", "env.clip_reward=10.0"]
    return common + [
        "algo=sac", f"total_steps={args.sac_steps}", "num_envs=1", "algo.rollout_steps=1",
        f"algo.warmup_steps={args.sac_warmup}", f"algo.buffer_size={args.sac_buffer}", "algo.minibatch_size=256",
        "algo.lr=3e-4", "algo.utd=1.0", "algo.gamma=0.99", "algo.tau=0.005", "algo.init_temperature=1.0",
        "model.hidden_sizes=[256,256]", "model.activation=relu", "model.ortho_init=false",
        # SB3's SAC runs without VecNormalize here; rlinf's default (auto) would normalize MuJoCo state tasks
        "env.normalize_obs=false", "env.normalize_reward=false"]


def run_rlinf(args: argparse.Namespace, task: str, algo: str, seed: int) -> dict:
    rlinf = str(Path(sys.executable).with_name("rlinf"))
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [rlinf, "rl", *rlinf_args(args, task, algo, seed), *args.rlinf_set, f"run_dir={tmp}/run"]
        out = subprocess.run(cmd, capture_output=True, text=True, cwd=tmp)
        if out.returncode:
            raise SystemExit(f"rlinf {algo} {task} seed {seed} failed:\n{out.stderr[-2000:]}")
        lines = [json.loads(x) for x in Path(tmp, "run", "metrics.jsonl").read_text().splitlines()]
        result = json.loads(Path(tmp, "run", "result.json").read_text())
    train_s = sum(m.get("time/rollout_s", 0.0) + m.get("time/update_s", 0.0) for m in lines)
    cpu_s = sum(m.get("time/cpu_s", 0.0) for m in lines)
    curve = [(int(m["env_steps"]), float(m["rollout/return_mean"]), float(m.get("rollout/episodes", 1.0))) for m in lines
             if "rollout/return_mean" in m and "env_steps" in m]
    return {"env_steps": int(result["env_steps"]), "train_s": train_s, "cpu_s": cpu_s,
            "return": float(result["eval"]["return_mean"]), "curve": curve}


# -- report -----------------------------------------------------------------------------------------
def binned(curve: list, total: int, bins: int = 20) -> tuple[list[float], list[float]]:
    """Mean episode return per env-step bin (points are (step, mean return, episodes))."""
    sums, counts = [0.0] * bins, [0.0] * bins
    for step, ret, n in curve:
        b = min(int(step * bins / max(total, 1)), bins - 1)
        sums[b] += ret * n
        counts[b] += n
    xs = [(b + 0.5) * total / bins for b in range(bins) if counts[b]]
    return xs, [sums[b] / counts[b] for b in range(bins) if counts[b]]


def plot(task: str, runs: dict[str, list[dict]], out: Path) -> Path | None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    algos = sorted({name.split()[1] for name in runs if name.startswith(task + " ")})
    fig, axes = plt.subplots(1, len(algos), figsize=(6 * len(algos), 4), squeeze=False)
    for ax, algo in zip(axes[0], algos):
        for lib, color in (("sb3", "tab:blue"), ("rlinf", "tab:orange")):
            for i, r in enumerate(runs.get(f"{task} {algo} {lib}", [])):
                if r["curve"]:
                    x, y = binned(r["curve"], r["env_steps"])
                    ax.plot(x, y, color=color, alpha=0.8, lw=1.5, marker=".", label=lib if i == 0 else None)
        ax.set_title(f"{task} {algo.upper()}")
        ax.set_xlabel("env steps")
        ax.set_ylabel("training episode return (mean per bin)")
        ax.legend()
    fig.tight_layout()
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{task}.png"
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def return_gap_interval(sb3: list[float], mine: list[float], draws: int = 10_000) -> tuple[float, float]:
    """95% bootstrap interval of mean(mine) - mean(sb3), seeds resampled on each side on their own.

    The seeds of the two libraries are independent draws (the same seed number gives unrelated
    runs), so the interval says whether a gap in the means is more than seed-to-seed spread."""
    import numpy as np

    rng = np.random.default_rng(0)
    a, b = np.asarray(sb3, float), np.asarray(mine, float)
    diffs = (b[rng.integers(0, len(b), (draws, len(b)))].mean(1) - a[rng.integers(0, len(a), (draws, len(a)))].mean(1))
    lo, hi = np.percentile(diffs, [2.5, 97.5])
    return float(lo), float(hi)


def report(runs: dict[str, list[dict]], tasks: list[str], algos: list[str]) -> None:
    rows = []
    for task in tasks:
        for algo in algos:
            if f"{task} {algo} sb3" not in runs or f"{task} {algo} rlinf" not in runs:
                continue
            sb3, mine = runs[f"{task} {algo} sb3"], runs[f"{task} {algo} rlinf"]
            mean = lambda xs: sum(x["return"] for x in xs) / len(xs)  # noqa: E731
            sps = lambda xs: median([x["env_steps"] / x["train_s"] for x in xs])  # noqa: E731
            # each seed's rlinf run over the SB3 run beside it (parallel) or just before it (sequential)
            paired = median([(b["env_steps"] / b["train_s"]) / (a["env_steps"] / a["train_s"])
                             for a, b in zip(sb3, mine)])
            gap = "-"
            if min(len(sb3), len(mine)) >= 2:
                lo, hi = return_gap_interval([x["return"] for x in sb3], [x["return"] for x in mine])
                gap = f"{lo:+,.0f} .. {hi:+,.0f}"
            rows.append([task, algo.upper(), len(sb3), mean(sb3), mean(mine), mean(mine) - mean(sb3), gap, sps(sb3),
                         sps(mine), sps(mine) / sps(sb3), paired])
    print(table(["task", "algo", "seeds", "sb3 return", "rlinf return", "rlinf - sb3", "95% interval", "sb3 steps/s",
                 "rlinf steps/s", "x sb3 (steps/s)", "x sb3 (per seed)"], rows))
    print("returns: mean over seeds of 10 deterministic held-out episodes; interval: bootstrap over seeds of the "
          "difference of the means; steps/s: median over seeds, training loop only; per seed: median over seeds "
          "of rlinf / sb3 of the same seed")


def merge(dirs: list[str], out: Path) -> None:
    """One report over the runs.json of several invocations (e.g. seeds run on different days)."""
    def fail(msg: str) -> None:
        print(f"--merge: {msg}", file=sys.stderr)
        raise SystemExit(2)

    if any(Path(d).resolve() == out.resolve() for d in dirs):
        fail(f"--out {out} is one of the merged folders (its runs.json would be overwritten); give a new --out")
    runs: dict[str, list[dict]] = {}
    for d in dirs:
        path = Path(d) / "runs.json"
        if not path.is_file():
            fail(f"{path} does not exist; give the --out folders of earlier runs")
        try:
            loaded = json.loads(path.read_text())
        except ValueError as exc:
            fail(f"{path} is not JSON ({exc}); was the run that wrote it interrupted?")
        for name, rs in loaded.items():
            runs.setdefault(name, []).extend(rs)
    for name, rs in runs.items():
        kinds = {json.dumps({**settings(name.split()[1]), **r.get("settings", {})}, sort_keys=True) for r in rs}
        if len(kinds) > 1:
            fail(f"the {name} runs were run with different settings ({' vs '.join(sorted(kinds))}); merge like with like")
    keys = [name.split() for name in runs if name.endswith(" sb3") and name.replace(" sb3", " rlinf") in runs]
    tasks = list(dict.fromkeys(k[0] for k in keys))
    algos = list(dict.fromkeys(k[1] for k in keys))
    publish(runs, tasks, algos, out)


def publish(runs: dict[str, list[dict]], tasks: list[str], algos: list[str], out: Path) -> None:
    """The table, runs.json and one learning-curve PNG per task in ``out`` (a run's and --merge's)."""
    report(runs, tasks, algos)
    out.mkdir(parents=True, exist_ok=True)
    (out / "runs.json").write_text(json.dumps(runs))
    for task in tasks:
        png = plot(task, runs, out)
        if png is not None:
            print(f"learning curves: {png}")


def settings(algo: str, ppo_anneal_lr: bool = False) -> dict:
    """The switchable settings of a run, kept in runs.json so --merge never pools runs of different
    settings (the defaults stand for runs written before a switch existed)."""
    return {"ppo_anneal_lr": ppo_anneal_lr} if algo == "ppo" else {}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tasks", default="Hopper-v5,HalfCheetah-v5,Walker2d-v5,Ant-v5")
    p.add_argument("--algos", default="ppo,sac")
    p.add_argument("--ppo-steps", type=int, default=300_000)
    p.add_argument("--sac-steps", type=int, default=100_000)
    p.add_argument("--sac-warmup", type=int, default=5_000)
    p.add_argument("--sac-buffer", type=int, default=1_000_000)
    p.add_argument("--envs", type=int, default=8, help="PPO envs")
    p.add_argument("--n-steps", type=int, default=128, help="PPO steps per env per rollout")
    p.add_argument("--ppo-anneal-lr", action="store_true",
                   help="both libraries decay PPO's learning rate linearly to 0 over the run (a diagnostic: the "
                        "bar's settings, those of benchmarks/ppo_vs_sb3.py, keep it constant)")
    p.add_argument("--seeds", type=int, default=2)
    p.add_argument("--seed", type=int, default=0, help="first seed")
    p.add_argument("--out", default="benchmarks/results/mujoco_vs_sb3", help="learning-curve PNGs and raw JSON")
    p.add_argument("--parallel", action="store_true",
                   help="run the SB3 and rlinf process of each (seed, task, algo) at the same time (1 thread each)")
    p.add_argument("--merge", nargs="+", metavar="DIR",
                   help="run nothing: report over the runs.json in these --out folders together (written to --out)")
    p.add_argument("--rlinf-set", action="append", default=[], metavar="KEY=VALUE",
                   help="extra override for every rlinf run (repeatable), e.g. train.bf16=true")
    # worker-only options
    p.add_argument("--sb3-worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--task", help=argparse.SUPPRESS)
    p.add_argument("--algo", help=argparse.SUPPRESS)
    p.add_argument("--steps", type=int, help=argparse.SUPPRESS)
    p.add_argument("--warmup", type=int, help=argparse.SUPPRESS)
    p.add_argument("--buffer", type=int, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.sb3_worker:
        return sb3_worker(args)
    if args.merge:
        return merge(args.merge, Path(args.out))
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    tasks = [t for t in args.tasks.split(",") if t]
    algos = [a for a in args.algos.split(",") if a]
    print(machine_line())
    budgets = {"ppo": f"PPO {args.ppo_steps:,} steps ({args.envs} envs x {args.n_steps})"
                      + (", learning rate annealed linearly to 0 on both sides" if args.ppo_anneal_lr else ""),
               "sac": f"SAC {args.sac_steps:,} steps (warm-up {args.sac_warmup:,})"}
    print(f"tasks {tasks}; {'; '.join(budgets[a] for a in algos)}; seeds {args.seed}..{args.seed + args.seeds - 1}",
          flush=True)
    if args.rlinf_set:
        print(f"rlinf overrides: {' '.join(args.rlinf_set)}")
    print("mode: " + ("parallel (sb3 and rlinf at the same time)" if args.parallel else "sequential (sb3, then rlinf)"))
    libs = (("sb3", run_sb3), ("rlinf", run_rlinf))
    runs: dict[str, list[dict]] = {}
    # two threads only wait on their child processes (subprocess.run releases the GIL)
    pool = concurrent.futures.ThreadPoolExecutor(max_workers=2) if args.parallel else None
    for s in range(args.seeds):
        seed = args.seed + s
        for task in tasks:
            for algo in algos:
                if pool is not None:
                    futures = [pool.submit(fn, args, task, algo, seed) for _, fn in libs]
                    results = [f.result() for f in futures]
                else:
                    results = [fn(args, task, algo, seed) for _, fn in libs]
                for (lib, _), r in zip(libs, results):
                    r["seed"] = seed
                    r["settings"] = settings(algo, args.ppo_anneal_lr)
                    runs.setdefault(f"{task} {algo} {lib}", []).append(r)
                    print(f"  seed {seed} {task} {algo} {lib}: return {r['return']:.1f}, "
                          f"{r['env_steps'] / r['train_s']:,.0f} env-steps/s", flush=True)
                if pool is not None:
                    pair = {lib: r['env_steps'] / r['train_s'] for (lib, _), r in zip(libs, results)}
                    print(f"  seed {seed} {task} {algo}: side by side, rlinf / sb3 = "
                          f"{pair['rlinf'] / pair['sb3']:.2f}x env-steps/s", flush=True)
    if pool is not None:
        pool.shutdown()
    publish(runs, tasks, algos, Path(args.out))
    print("load after: " + machine_line().split("load average ")[1])


if __name__ == "__main__":
    main()
