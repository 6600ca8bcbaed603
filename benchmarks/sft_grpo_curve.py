"""SFT then GRPO on 2-digit addition through the CLI; prints held-out exact match along the way.

    python benchmarks/sft_grpo_curve.py                         # SFT (8 epochs), then 200 GRPO iterations
    python benchmarks/sft_grpo_curve.py --sft DIR --iterations 100 --no-filter

The bar (issue 4): GRPO raises held-out greedy exact match by >= 20 points over the SFT
checkpoint. Runs `rlinf collect`, `rlinf sft` and `rlinf rl` as a user would (~5 min of SFT and
~1-2 s per GRPO iteration on one CPU thread).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

SIM = ["sim=arithmetic", "sim.min_digits=2", "sim.digits=2"]
QUIET = ["tracking.enabled=false", "progress=false"]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sft", type=Path, help="an SFT checkpoint to start from (built when omitted)")
    p.add_argument("--iterations", type=int, default=200)
    p.add_argument("--no-filter", action="store_true", help="plain GRPO (no dynamic sampling)")
    p.add_argument("--eval", type=int, default=300, help="held-out prompts")
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args()
    rlinf = str(Path(sys.executable).with_name("rlinf"))
    work = Path(tempfile.mkdtemp(prefix="rlinf-curve-"))
    sft = a.sft
    if sft is None:
        subprocess.run([rlinf, "collect", *SIM, "policy=expert", "episodes=6000", f"output={work}/add2.jsonl", *QUIET],
                       check=True, cwd=work)
        subprocess.run([rlinf, "sft", f"dataset={work}/add2.jsonl", "model=hf", "algo.epochs=8", "algo.minibatch_size=64",
                        "algo.lr=1e-3", "eval.episodes=0", f"seed={a.seed}", f"run_dir={work}/sft", *QUIET],
                       check=True, cwd=work)
        sft = work / "sft/checkpoints/best"
    subprocess.run([rlinf, "rl", "--algo", "grpo", f"init={sft}", f"text.iterations={a.iterations}", "algo.groups=16",
                    "algo.group_size=8", "algo.epochs=1", "algo.lr=2e-4", f"algo.filter_groups={str(not a.no_filter).lower()}",
                    f"eval.episodes={a.eval}", "eval.interval=20", f"seed={a.seed}", f"run_dir={work}/rl", *QUIET],
                   check=True, cwd=work)
    rows = [json.loads(x) for x in (work / "rl/metrics.jsonl").read_text().splitlines()]
    curve = {}
    for r in rows:
        if "eval/accuracy" in r:
            curve[int(r["step"])] = r["eval/accuracy"]
    print("iteration  held-out exact match")
    for it, acc in sorted(curve.items()):
        print(f"{it:9d}  {acc:.1%}")
    first, last = curve[min(curve)], curve[max(curve)]
    print(f"GRPO raised held-out exact match by {100 * (last - first):+.1f} points ({first:.1%} -> {last:.1%}); bar: +20")


if __name__ == "__main__":
    main()
