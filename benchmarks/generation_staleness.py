"""GRPO on one-digit sums with the rollout sampled one weight version behind (runtime.max_staleness=1,
2 generation workers) against sampling in the trainer (max_staleness=0, no workers): held-out greedy
accuracy gained over seeds, and seconds per iteration. The recipe is the learning test's
(tests/cli/test_text_cli.py: test_sft_then_grpo_raises_reward): one SFT clone (seed 0), then 30 GRPO
iterations of 8 prompts x 8 completions per seed; tests/cli/test_generation_workers.py (test_stale_generation_learns_like_synchronous_sampling) takes its bar from here.

    python benchmarks/generation_staleness.py --seeds 0-3 --out /tmp/staleness

``--smollm2 N`` measures the overlap where sampling costs about as much as the update instead (no
learning curve): N GRPO iterations of SmolLM2-135M-Instruct with LoRA on reasoning-gym
basic_arithmetic (4 prompts x 8 samples, 32 new tokens, after `make smollm2`), sampling in the
trainer at 2 threads and at 1, and 1 generation worker at ``runtime.max_staleness=1`` (trainer and
worker 1 thread each: the two cores split); the median s/iteration after the first, and the fraction
of each iteration's wall time the worker sampled while the trainer updated.

    python benchmarks/generation_staleness.py --smollm2 6 --out /tmp/staleness-smollm2
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import seeds  # noqa: E402

BIN = Path(sys.executable).with_name("rlinf")
TINY = ["model.hidden_size=64", "model.layers=2", "model.heads=2", "model.kv_heads=1", "model.intermediate_size=128"]
QUIET = ["tracking.enabled=false", "progress=false"]
RL = ["text.iterations=30", "algo.groups=8", "algo.group_size=8", "algo.epochs=1", "algo.lr=2e-4", "eval.episodes=64",
      "eval.seed=0", "eval.interval=30", *QUIET]
MODES = {"k0_in_process": [], "k1_2_workers": ["placement.generation.workers=2", "runtime.max_staleness=1"]}
SMOLLM2 = ["sim=reasoning_gym", "sim.task=basic_arithmetic", "sim.max_new_tokens=32",
           "sim.params={min_terms: 2, max_terms: 2, min_digits: 1, max_digits: 2, operators: ['+', '-', '*'], "
           "allow_parentheses: false, allow_negation: false}",
           "model=hf", "model.preset=smollm2", "model.lora.r=16", "model.temperature=0.7", "algo.groups=4",
           "algo.group_size=8", "algo.epochs=2", "algo.lr=2e-4", "eval.best=false", "eval.episodes=0", "seed=0", *QUIET]
SMOLLM2_MODES = {"in_trainer_2_threads": ["train.threads=2"], "in_trainer_1_thread": ["train.threads=1"],
                 "1_worker_k1_1_thread": ["train.threads=1", "placement.generation.workers=1", "runtime.max_staleness=1"]}


def rlinf(out: Path, *args: str) -> None:
    proc = subprocess.run([str(BIN), *args], cwd=out, capture_output=True, text=True)
    if proc.returncode:
        raise SystemExit(f"rlinf {' '.join(args)} failed:\n{proc.stderr[-3000:]}")


def clone(out: Path) -> str:
    """The SFT checkpoint every seed starts from (made once)."""
    if not (out / "sft/result.json").is_file():
        rlinf(out, "collect", "sim=arithmetic", "sim.digits=1", "policy=expert", "episodes=1000",
              "output=data/add.jsonl", *QUIET)
        rlinf(out, "sft", "dataset=data/add.jsonl", "model=hf", *TINY, "algo.epochs=3", "algo.minibatch_size=32",
              "algo.lr=3e-3", "eval.episodes=0", "run_dir=sft", "seed=0", *QUIET)
    return json.loads((out / "sft/result.json").read_text())["checkpoint"]


def gain(run_dir: Path) -> dict[str, float]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    before = next(m["eval/accuracy"] for m in rows if m["step"] == 0)
    after = json.loads((run_dir / "result.json").read_text())["eval"]["accuracy"]
    steps = [m["time/step_s"] for m in rows if "time/step_s" in m]
    lag = [m["rollout/weight_version_lag"] for m in rows if "rollout/weight_version_lag" in m]
    # the fraction of each iteration's wall time the workers sampled while the trainer updated
    overlap = [m["time/generation_overlap_frac"] for m in rows if "time/generation_overlap_frac" in m][1:]
    busy = [m["time/generation_busy_s"] / m["time/step_s"] for m in rows if "time/generation_busy_s" in m]
    return {"before": before, "after": after, "gain": after - before, "step_s": statistics.median(steps),
            "lag_max": max(lag) if lag else 0.0, "overlap_frac": statistics.median(overlap) if overlap else 0.0,
            "generation_busy_frac": statistics.median(busy) if busy else 0.0}


def overlap(out: Path, iterations: int) -> None:
    """The SmolLM2 timing rows (module docstring)."""
    print("\n| sampling | s/iteration (median, after the first) | generation busy / wall | overlap with the update / wall |"
          "\n|---|---|---|---|")
    for mode, extra in SMOLLM2_MODES.items():
        run = out / f"smollm2-{mode}"
        if not (run / "result.json").is_file():
            rlinf(out, "rl", "--algo", "grpo", *SMOLLM2, f"text.iterations={iterations}", f"run_dir={run.name}", *extra)
        rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
        rows = [m for m in rows if "time/step_s" in m][1:]
        step = statistics.median(m["time/step_s"] for m in rows)
        busy = [m["time/generation_busy_s"] / m["time/step_s"] for m in rows if "time/generation_busy_s" in m]
        over = [m["time/generation_overlap_frac"] for m in rows if "time/generation_overlap_frac" in m]
        print(f"| {mode} | {step:.1f} | {statistics.median(busy):.2f} | {statistics.median(over):.2f} |" if busy else
              f"| {mode} | {step:.1f} | - | - |", flush=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seeds", default="0-3")
    p.add_argument("--out", default="/tmp/rlinf-staleness")
    p.add_argument("--smollm2", type=int, default=0, metavar="N", help="the SmolLM2 overlap timing instead, N iterations")
    args = p.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.smollm2:
        return overlap(out, args.smollm2)
    init = clone(out)
    results = out / "results.jsonl"
    for seed in seeds(args.seeds):
        for mode, extra in MODES.items():
            run = out / f"{mode}-seed{seed}"
            if not (run / "result.json").is_file():
                t0 = time.time()
                rlinf(out, "rl", "--algo", "grpo", f"init={init}", *RL, f"run_dir={run.name}", f"seed={seed}", *extra)
                print(f"{mode} seed {seed}: {time.time() - t0:.0f} s", flush=True)
            row = {"mode": mode, "seed": seed, **gain(run)}
            with results.open("a") as f:
                f.write(json.dumps(row) + "\n")
            print(json.dumps(row), flush=True)
    rows = [json.loads(line) for line in results.read_text().splitlines()]
    print("\n| mode | seeds | gain min | median | max | s/iteration (median) | overlap (median) |\n|---|---|---|---|---|---|---|")
    for mode in MODES:
        g = [r["gain"] for r in rows if r["mode"] == mode]
        s = [r["step_s"] for r in rows if r["mode"] == mode]
        o = [r.get("overlap_frac", 0.0) for r in rows if r["mode"] == mode]
        if g:
            print(f"| {mode} | {len(g)} | {min(g):+.3f} | {statistics.median(g):+.3f} | {max(g):+.3f} | "
                  f"{statistics.median(s):.2f} | {statistics.median(o):.2f} |")


if __name__ == "__main__":
    main()
