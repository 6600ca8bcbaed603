"""Behaviour cloning from the rlinf format vs from the LeRobot format, on the same demonstrations.

For each case the scripted expert's demos are collected twice with the same seeds, once as an
rlinf dataset and once as a LeRobot v3.0 dataset (``format=lerobot``: parquet + h264 mp4 per
camera); the same SFT runs on each, and both clones are evaluated on the same held-out seeds.
State features travel losslessly; camera frames go through the video codec, so the pixel case
also reports how far the decoded frames are from the rendered ones.

    python benchmarks/lerobot_roundtrip.py                       # push-v3 (state) and drawer-close-v3 (pixels)
    python benchmarks/lerobot_roundtrip.py --cases state --demos 10 --eval-episodes 100

Prints one table: success_once of each clone, the difference in points, dataset size on disk and
collect time per format.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import run_stage as run  # noqa: E402  (one way to run a stage, shared)
from metaworld_pipeline import EVAL_SEED  # noqa: E402


def du(path: Path) -> float:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) / 2**20


def frame_error(native: Path, lerobot_dir: Path) -> tuple[float, float]:
    """Mean absolute pixel error and PSNR (dB) of the LeRobot dataset's decoded frames vs the rendered ones."""
    from rlinf_cli.data import dataset as ds, lerobot

    a = ds.load(native).obs["rgb"].astype(np.float64)
    b = lerobot.load(lerobot_dir).obs["rgb"].astype(np.float64)
    mse = float(((a - b) ** 2).mean())
    return float(np.abs(a - b).mean()), 10 * np.log10(255.0**2 / max(mse, 1e-12))


def case(name: str, a: argparse.Namespace, root: Path) -> dict:
    pixels = name == "pixels"
    task = a.pixel_task if pixels else a.task
    demos = a.pixel_demos if pixels else a.demos
    sim = ["sim=metaworld", f"sim.task={task}", f"sim.max_episode_steps={a.max_episode_steps}"]
    if pixels:
        sim += ["sim.obs=state_rgb", f"sim.image_size={a.image_size}"]
    model = (["model.obs_keys=[rgb,proprio]"] if pixels else []) + ["model.hidden_sizes=[256,256]"]
    epochs = a.pixel_epochs if pixels else a.epochs
    eval_sim = ["sim.obs=rgb"] if pixels else []
    out: dict = {"case": f"{task} ({'pixels' if pixels else 'state'}), {demos} demos"}
    for fmt in ("rlinf", "lerobot"):
        d = root / name / fmt
        log = d / "log.txt"
        d.mkdir(parents=True, exist_ok=True)
        common = ["progress=false", f"runs_dir={d / 'rlinf_runs'}"]
        res = run(["collect", *sim, *common, "policy=expert", "only_success=true", f"episodes={demos}", "num_envs=2",
                   f"format={fmt}", f"output={d / 'data'}", f"run_dir={d / 'collect'}"], log)
        out[f"{fmt}_collect_s"] = res["wall_s"]
        out[f"{fmt}_mb"] = du(d / "data")
        res = run(["sft", *common, f"dataset={d / 'data'}", *model, f"algo.epochs={epochs}", "algo.minibatch_size=64",
                   "val_fraction=0", "eval.episodes=0", f"run_dir={d / 'sft'}"], log)
        res = run(["eval", *common, f"checkpoint={res['checkpoint']}", *eval_sim, f"episodes={a.eval_episodes}",
                   f"seed={EVAL_SEED}", f"run_dir={d / 'eval'}"], log)
        out[fmt] = res["eval"]["success_once"]
    if pixels:
        out["frame_mae"], out["frame_psnr"] = frame_error(root / name / "rlinf" / "data", root / name / "lerobot" / "data")
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--cases", default="state,pixels")
    p.add_argument("--task", default="push-v3")
    p.add_argument("--demos", type=int, default=10)
    p.add_argument("--epochs", type=int, default=200)
    p.add_argument("--pixel-task", default="drawer-close-v3")
    p.add_argument("--pixel-demos", type=int, default=10)
    p.add_argument("--pixel-epochs", type=int, default=60)
    p.add_argument("--image-size", type=int, default=64)
    p.add_argument("--max-episode-steps", type=int, default=150)
    p.add_argument("--eval-episodes", type=int, default=50)
    p.add_argument("--out", default="rlinf_runs/bench_lerobot_roundtrip/" + time.strftime("%Y%m%d-%H%M%S"))
    a = p.parse_args()
    root = Path(a.out)
    rows = []
    t0 = time.time()
    for name in a.cases.split(","):
        rows.append(case(name.strip(), a, root))
        print(f"done: {rows[-1]['case']} ({time.time() - t0:.0f} s)", flush=True)
    print(f"\nBC from the rlinf format vs the LeRobot format ({time.strftime('%Y-%m-%d %H:%M')}), "
          f"success_once on {a.eval_episodes} held-out seeds")
    print(f"| case | rlinf format | LeRobot format | difference | dataset MB (rlinf / LeRobot) | collect s (rlinf / LeRobot) | decoded frames |")
    print("|---|---:|---:|---:|---:|---:|---|")
    for r in rows:
        frames = f"MAE {r['frame_mae']:.2f}/255, PSNR {r['frame_psnr']:.1f} dB" if "frame_mae" in r else "lossless (no images)"
        print(f"| {r['case']} | {r['rlinf']:.0%} | {r['lerobot']:.0%} | {100 * (r['lerobot'] - r['rlinf']):+.0f} points | "
              f"{r['rlinf_mb']:.2f} / {r['lerobot_mb']:.2f} | {r['rlinf_collect_s']:.0f} / {r['lerobot_collect_s']:.0f} | {frames} |")


if __name__ == "__main__":
    main()
