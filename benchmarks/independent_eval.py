"""Evaluate an `rl` checkpoint of the ``mlp`` model on a gymnasium task without rlinf's eval loop.

A check of rlinf's evaluation, and a measure of how much a held-out return depends on things it
should not: the actor's weights are read from ``model.safetensors`` and run in numpy (float32, as
rlinf's acting path does, or float64), observations are normalized with the checkpoint's saved
statistics (``normalizer.safetensors``, when the run had them, with the clip and epsilon saved
beside them), and episodes come from a plain ``gymnasium.make(task)`` (by default the checkpoint's
``sim.env_id``) reset on seeds ``seed, seed+1, ...``. Deterministic actions: the mean (a
Gaussian policy, clipped to the action bounds) or the tanh-squashed mean (``squash``, SAC).
Prints one JSON line: the mean return and every episode's.

    python benchmarks/independent_eval.py CHECKPOINT --episodes 10 --seed 1000000
    python benchmarks/independent_eval.py CHECKPOINT --task Ant-v5 --episodes 100 --dtype float64

Compare with ``rlinf eval checkpoint=CHECKPOINT episodes=10 seed=1000000 num_envs=1``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np


def fail(msg: str) -> None:
    print(f"independent_eval: {msg}", file=sys.stderr)
    raise SystemExit(2)


def load_actor(ckpt: Path, dtype: type) -> tuple[list[tuple[np.ndarray, np.ndarray]], dict]:
    from safetensors.numpy import load_file

    try:
        cfg = json.loads((ckpt / "config.json").read_text())["model"]
        weights = load_file(str(ckpt / "model.safetensors"))
    except (OSError, KeyError, ValueError) as exc:
        fail(f"{ckpt} is not an rl checkpoint of the mlp model ({type(exc).__name__}: {exc})")
    if cfg.get("name") != "mlp" or len(cfg.get("obs_keys", [])) != 1:
        fail(f"{ckpt}: only the mlp model on one observation key is covered, got {cfg.get('name')} {cfg.get('obs_keys')}")
    idx = sorted(int(k.split(".")[1]) for k in weights if k.startswith("actor.") and k.endswith(".weight"))
    layers = [(weights[f"actor.{i}.weight"].astype(dtype).T, weights[f"actor.{i}.bias"].astype(dtype)) for i in idx]
    return layers, cfg


def load_normalizer(ckpt: Path, key: str) -> tuple[np.ndarray, np.ndarray, float, float] | None:
    """(mean, var, clip_obs, eps) of the observation entry ``key``, or None without statistics."""
    f = ckpt / "normalizer.safetensors"
    if not f.is_file():
        return None
    from safetensors.numpy import load_file

    state = load_file(str(f))
    if f"{key}.mean" not in state:  # statistics of rewards only
        return None
    # the file's "config" row: (obs, reward, clip_obs, clip_reward, gamma, eps), as the run had them
    _, _, clip_obs, _, _, eps = (float(x) for x in state["config"])
    return state[f"{key}.mean"].astype(np.float64), state[f"{key}.var"].astype(np.float64), clip_obs, eps


def checkpoint_task(ckpt: Path) -> str:
    """The gymnasium id the checkpoint was trained on (its rlinf.yaml's ``sim.env_id``)."""
    import yaml

    try:
        return str(yaml.safe_load((ckpt / "rlinf.yaml").read_text())["sim"]["env_id"])
    except (OSError, KeyError, TypeError, yaml.YAMLError):
        fail(f"{ckpt}/rlinf.yaml names no sim.env_id; give --task")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("checkpoint")
    p.add_argument("--task", help="gymnasium id, e.g. Ant-v5 (default: the checkpoint's sim.env_id)")
    p.add_argument("--episodes", type=int, default=10)
    p.add_argument("--seed", type=int, default=1_000_000, help="reset seed of the first episode")
    p.add_argument("--dtype", choices=("float32", "float64"), default="float32", help="the actor's arithmetic")
    args = p.parse_args()
    import gymnasium as gym

    dtype = np.float32 if args.dtype == "float32" else np.float64
    ckpt = Path(args.checkpoint)
    layers, cfg = load_actor(ckpt, dtype)
    norm = load_normalizer(ckpt, cfg["obs_keys"][0])
    act = np.tanh if cfg.get("activation") == "tanh" else (lambda x: np.maximum(x, 0))
    task = args.task or checkpoint_task(ckpt)
    try:
        env = gym.make(task)
    except gym.error.Error as exc:
        fail(f"cannot make gymnasium task {task!r} ({exc})")
    low, high = env.action_space.low.astype(np.float64), env.action_space.high.astype(np.float64)
    dim = int(np.prod(env.action_space.shape))
    want = (int(np.prod(env.observation_space.shape)), dim * (2 if cfg.get("squash") else 1))
    if (layers[0][0].shape[0], layers[-1][0].shape[1]) != want:
        fail(f"the checkpoint's actor maps {layers[0][0].shape[0]} -> {layers[-1][0].shape[1]}, {task} needs "
             f"{want[0]} -> {want[1]}; was it trained on another task?")

    def action(obs: np.ndarray) -> np.ndarray:
        if norm is not None:  # rlinf's arithmetic: float64 statistics, float32 result
            mean, var, clip, eps = norm
            obs = np.clip((obs - mean) / np.sqrt(var + eps), -clip, clip).astype(np.float32)
        x = obs.astype(dtype)
        for i, (w, b) in enumerate(layers):
            x = x @ w + b
            if i < len(layers) - 1:
                x = act(x)
        if cfg.get("squash"):
            return (low + high) / 2 + (high - low) / 2 * np.tanh(x[:dim])
        return np.clip(x, low, high)

    returns = []
    for i in range(args.episodes):
        obs, _ = env.reset(seed=args.seed + i)
        done, ret = False, 0.0
        while not done:
            obs, r, term, trunc, _ = env.step(action(obs))
            ret += float(r)
            done = term or trunc
        returns.append(ret)
    print(json.dumps({"checkpoint": str(ckpt), "task": task, "dtype": args.dtype, "episodes": args.episodes,
                      "return_mean": float(np.mean(returns)), "return_std": float(np.std(returns)),
                      "returns": [round(r, 1) for r in returns]}))


if __name__ == "__main__":
    main()
