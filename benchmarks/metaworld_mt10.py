"""Meta-World MT10 from a few demonstrations: SFT -> PPO, SFT -> GRPO and SAC from the demos, per
task, over several training seeds, with the settings rlinf ships (no per-run tuning flags).

MT10 is Meta-World's ten-task set (Yu et al. 2019): reach, push, pick-place, door-open,
drawer-open, drawer-close, button-press-topdown, peg-insert-side, window-open, window-close. Each
cell is single-task: the scripted expert collects ``--demos`` successful demonstrations, ``rlinf
sft`` clones them, ``rlinf rl init=<clone>`` fine-tunes the clone with PPO and with GRPO on the
sparse success reward, and SAC learns from the same demonstrations (RLPD-style, no SFT). Every RL
row is the run's **kept** policy (best on validation seeds 2,000,000+, the clone included: what
``rlinf pipeline`` hands on), and every policy is evaluated on the same held-out seeds
(1,000,000+, never trained or validated on). The stages are `benchmarks/metaworld_pipeline.py`'s
(one shared path); this script adds the seeds, the medians and spreads and the total CPU time.

    python benchmarks/metaworld_mt10.py                                  # the issue's table (hours on 2 cores)
    python benchmarks/metaworld_mt10.py --seeds 0 --grpo-steps 0 --sac-steps 0   # PPO, one seed
    python benchmarks/metaworld_mt10.py --tasks <four other tasks> --out ...      # the recipe on held-out tasks
    python benchmarks/metaworld_mt10.py --multitask --out ...                     # one policy for all ten tasks

``--multitask`` is the second row: one MLP for all ``--tasks`` (it embeds the task id), cloned
from ``--demos`` demonstrations per task and fine-tuned with the same budget and validation
episodes per task; its table has the same per-task rows.

Prints one table per run: per task, the median over seeds of each policy's held-out success with
its range (min-max), whether every RL row is >= its clone, and the mean over tasks of the medians.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import machine_line  # noqa: E402
from metaworld_pipeline import pipeline  # noqa: E402

MT10 = ["reach-v3", "push-v3", "pick-place-v3", "door-open-v3", "drawer-open-v3", "drawer-close-v3",
        "button-press-topdown-v3", "peg-insert-side-v3", "window-open-v3", "window-close-v3"]
LABELS = ("expert", "SFT", "SFT+PPO", "SFT+GRPO", "SAC+demos", "SFT sq", "SFT sq+SAC")


MULTI = "multi-task"


def per_task(row: dict, tasks: list[str]) -> list[dict]:
    """A multi-task cell as one row per task (its CPU time shared out), so that both kinds of cell
    make the same table; a single-task row as it is."""
    if row["task"] != MULTI:
        return [row]
    return [{**row, "task": t, "success": {k: v[t] for k, v in row["success"].items()}, "cpu_s": row["cpu_s"] / len(tasks)}
            for t in tasks]


def cell(values: list[float]) -> str:
    """Median over seeds with the range, in percent: ``62% (54-70)``."""
    med = statistics.median(values)
    if len(values) == 1:
        return f"{med:.0%}"
    return f"{med:.0%} ({min(values):.0%}-{max(values):.0%})"


def summarise(rows: list[dict], a: argparse.Namespace, wall_s: float, cpu_s: float) -> str:
    tasks = list(dict.fromkeys(r["task"] for r in rows))
    labels = [k for k in LABELS if k in rows[0]["success"]]
    rl = [k for k in labels if k.startswith(("SFT+", "SAC+"))]
    head = ["task", *labels, "SFT+RL >= clone (every seed)", "kept: clone"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    medians: dict[str, list[float]] = {k: [] for k in labels}
    never_worse = True
    for task in tasks:
        mine = [r for r in rows if r["task"] == task]
        cells = []
        for k in labels:
            vals = [r["success"][k] for r in mine]
            medians[k].append(statistics.median(vals))
            cells.append(cell(vals))
        # fine-tuning measured against the clone of its own seed; SAC starts from no clone (kept-best
        # cannot promise it more than the SFT row), so it is not part of this column
        ok = all(r["success"][k] >= r["success"]["SFT"] for r in mine for k in rl if k.startswith("SFT+"))
        never_worse &= ok
        clone_kept = sum(r["kept"].get(k) == "init" for r in mine for k in rl if k.startswith("SFT+"))
        lines.append("| " + " | ".join([task, *cells, "yes" if ok else "**no**",
                                        f"{clone_kept}/{len(mine) * sum(k.startswith('SFT+') for k in rl)}"]) + " |")
    mean = {k: statistics.fmean(v) for k, v in medians.items()}
    lines.append("| " + " | ".join([f"**mean of medians ({len(tasks)} tasks)**", *(f"**{mean[k]:.0%}**" for k in labels),
                                    "yes" if never_worse else "**no**", ""]) + " |")
    lines.append("")
    lines.append(("one multi-task policy for all tasks (task-id embedding), " if getattr(a, "multitask", False) else "")
                 + f"{a.demos} demos/task, seeds {' '.join(map(str, a.seeds))}, success_once on {a.eval_episodes} held-out "
                 "seeds per task; " + ", ".join([f"{k} - SFT = {(mean[k] - mean['SFT']) * 100:+.0f} points" for k in rl]
                                                + ([f"SFT sq+SAC - SFT sq = {(mean['SFT sq+SAC'] - mean['SFT sq']) * 100:+.0f} "
                                                    "points"] if "SFT sq+SAC" in mean else []))
                 + f"; wall {wall_s / 60:.1f} min (this invocation) with --jobs {a.jobs}, CPU {cpu_s / 3600:.2f} h "
                 "(every stage's processes, all cells)")
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tasks", nargs="+", default=MT10)
    p.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2], help="training seeds (demos, SFT and RL)")
    p.add_argument("--demos", type=int, default=10, help="expert demonstrations per task (the issue: <= 10)")
    p.add_argument("--max-episode-steps", type=int, default=200)
    p.add_argument("--hidden", default="[256,256]", help="MLP hidden sizes")
    p.add_argument("--sft-epochs", type=int, default=600)
    p.add_argument("--ppo-steps", type=int, default=None, help="0 skips PPO; default: the task's recommended "
                   "budget (400,000 for pick-* and peg-*), else 100,000")
    p.add_argument("--grpo-steps", type=int, default=100_000, help="0 skips GRPO")
    p.add_argument("--sac-steps", type=int, default=50_000, help="0 skips SAC from the demonstrations")
    p.add_argument("--sac-init", action="store_true", help="SAC starts from a clone of the demos in its form "
                   "(squashed actor, Q heads, mean-action loss; row 'SFT sq') instead of from scratch")
    # no per-algorithm flags by default: the Meta-World plugin's recommendations are the recipe
    p.add_argument("--sft", nargs="*", default=[], help="extra overrides for the SFT stage (e.g. model.head=flow "
                   "model.chunk=4: the clone's model, which RL inherits)")
    p.add_argument("--ppo", nargs="*", default=[], help="extra overrides for the PPO stage")
    p.add_argument("--grpo", nargs="*", default=[], help="extra overrides for the GRPO stage")
    # eval.interval in SAC's iterations (8 env steps each with one env): 3200 validates every 25,600
    # env steps, as --rl's 25 PPO iterations of 8 x 128; --rl's 25 would validate SAC every 200 steps
    p.add_argument("--sac", nargs="*", default=["num_envs=1", "algo.warmup_steps=0", "algo.init_temperature=0.05",
                                                 "algo.bc_coef=1.0", "model.activation=relu", "checkpoint.interval=1000",
                                                 "eval.interval=3200"],
                   help="extra overrides for the SAC stage (as metaworld_pipeline.py's, validated as often as PPO)")
    # validation every 25 iterations besides the default start and end: the kept policy is chosen
    # among several candidates (10 episodes, the default since 2026-12-07, set explicitly); a task
    # whose recommendation sets them (pick-*, peg-*: 20 every 8) keeps its own
    p.add_argument("--rl", nargs="*", default=None,
                   help="overrides for every RL stage (default: 10 validation episodes every 25 iterations, "
                   "where the task's recommendation does not set them)")
    p.add_argument("--last", action="store_true", help="evaluate each RL run's last policy, not its kept one")
    p.add_argument("--eval-episodes", type=int, default=50)
    p.add_argument("--multitask", action="store_true", help="one multi-task policy for all --tasks per seed "
                   "instead of one policy per task")
    p.add_argument("--jobs", type=int, default=2, help="cells (task, seed) run in parallel")
    p.add_argument("--out", default="rlinf_runs/bench_mt10/" + time.strftime("%Y%m%d-%H%M%S"))
    a = p.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    print(machine_line(), flush=True)
    cells = [(t, s) for s in a.seeds for t in ([MULTI] if a.multitask else a.tasks)]
    t0 = time.time()
    done = out / "rows.jsonl"  # one line per finished cell: a stopped run restarts where it was
    rows = [json.loads(line) for line in done.read_text().splitlines()] if done.is_file() else []
    have = {(r["task"], r["seed"]) for r in rows}

    def one(ts: tuple[str, int]) -> dict:
        task, seed = ts
        row = pipeline(a.tasks if task == MULTI else task, a, seed=seed, root=out / f"{task}-s{seed}")
        with open(done, "a") as f:
            f.write(json.dumps(row) + "\n")
        return row

    with ThreadPoolExecutor(a.jobs) as pool:
        rows += list(pool.map(one, [c for c in cells if c not in have]))
    rows = [x for r in rows for x in per_task(r, a.tasks)]
    # this invocation's cells only (an --out shared by several invocations holds others too)
    rows = [r for r in rows if r["task"] in a.tasks and r["seed"] in a.seeds]
    rows.sort(key=lambda r: (a.tasks.index(r["task"]), r["seed"]))
    cpu = sum(r["cpu_s"] for r in rows)  # every cell's, those of an earlier, stopped invocation too
    text = summarise(rows, a, time.time() - t0, cpu)
    print(text)
    (out / "table.md").write_text(text + "\n")
    (out / "results.json").write_text(json.dumps({"args": vars(a), "rows": rows, "cpu_s": cpu}, indent=2))
    print(f"\nresults: {out}/results.json")


if __name__ == "__main__":
    main()
