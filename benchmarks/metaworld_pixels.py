"""A pixel-observation policy on Meta-World: expert demos (image + proprioception) -> SFT -> PPO.

The expert reads the state, so demos are collected with ``sim.obs=state_rgb`` and the model is
told to use only the camera image and the proprioception (``model.obs_keys=[rgb,proprio]``):
the policy never sees object or goal positions. Every policy (random, SFT, SFT+PPO) is evaluated
on the same held-out seeds with pixel observations.

    python benchmarks/metaworld_pixels.py                                   # drawer-close-v3
    python benchmarks/metaworld_pixels.py --task reach-v3 --demos 30 --ppo-steps 10000

Prints one table: success_once and mean return per policy, and the wall time of each stage.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import run_stage as run  # noqa: E402  (one way to run a stage, shared)
from metaworld_pipeline import EVAL_SEED  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--task", default="drawer-close-v3")
    p.add_argument("--demos", type=int, default=20)
    p.add_argument("--image-size", type=int, default=64)
    p.add_argument("--max-episode-steps", type=int, default=150)
    p.add_argument("--sft-epochs", type=int, default=60)
    p.add_argument("--ppo-steps", type=int, default=20_000, help="0 skips PPO")
    p.add_argument("--eval-episodes", type=int, default=30)
    p.add_argument("--out", default="rlinf_runs/bench_metaworld_pixels/" + time.strftime("%Y%m%d-%H%M%S"))
    a = p.parse_args()

    root = Path(a.out)
    root.mkdir(parents=True, exist_ok=True)
    log = root / "log.txt"
    common = ["progress=false", f"runs_dir={root / 'rlinf_runs'}"]
    sim = ["sim=metaworld", f"sim.task={a.task}", f"sim.max_episode_steps={a.max_episode_steps}",
           f"sim.image_size={a.image_size}"]
    model = ["model.obs_keys=[rgb,proprio]", "model.hidden_sizes=[256,256]"]
    times: dict[str, float] = {}
    t_all = time.time()

    res = run(["collect", *sim, "sim.obs=state_rgb", *common, "policy=expert", "only_success=true",
               f"episodes={a.demos}", "num_envs=2", f"output={root / 'data'}", f"run_dir={root / 'collect'}"], log)
    times["collect"] = res["wall_s"]
    res = run(["sft", *common, f"dataset={root / 'data'}", *model, f"algo.epochs={a.sft_epochs}",
               "algo.minibatch_size=64", "val_fraction=0", "eval.episodes=0", f"run_dir={root / 'sft'}"], log)
    times["sft"] = res["wall_s"]
    ckpts = {"random": "random", "SFT": res["checkpoint"]}
    if a.ppo_steps > 0:
        # the SFT checkpoint remembers sim.obs=state_rgb; RL and eval run on pixels + proprioception only
        res = run(["rl", "--algo", "ppo", *common, f"init={ckpts['SFT']}", "sim.obs=rgb", f"total_steps={a.ppo_steps}",
                   "eval.episodes=0", f"run_dir={root / 'ppo'}"], log)
        times["ppo"] = res["wall_s"]
        ckpts["SFT+PPO"] = res["checkpoint"]
    rows = []
    t0 = time.time()
    for label, ckpt in ckpts.items():
        res = run(["eval", *sim, "sim.obs=rgb", *common, f"checkpoint={ckpt}", f"episodes={a.eval_episodes}",
                   f"seed={EVAL_SEED}", f"run_dir={root / 'eval' / label.replace('+', '_')}"], log)
        rows.append((label, res["eval"]["success_once"], res["eval"]["return_mean"]))
    times["eval"] = time.time() - t0

    lines = ["| policy (pixels + proprio) | success_once | return |", "|---|---|---|"]
    lines += [f"| {label} | {s:.0%} | {r:.2f} |" for label, s, r in rows]
    lines.append("")
    lines.append(f"{a.task}, {a.demos} demos, {a.image_size}x{a.image_size} corner camera, "
                 f"{a.eval_episodes} held-out seeds; stage wall times: "
                 + ", ".join(f"{k} {v:.0f} s" for k, v in times.items())
                 + f"; total {(time.time() - t_all) / 60:.1f} min")
    text = "\n".join(lines)
    print(text)
    (root / "table.md").write_text(text + "\n")


if __name__ == "__main__":
    main()
