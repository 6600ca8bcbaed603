"""How much room each learning test's threshold has: every test marked `learning` run over several
seeds, on this CPU as it is and under the lesser-CPU settings of `make test-portable`
(tools/portable.py), with the number each test checks and its bar side by side.

    python benchmarks/learning_margins.py --seeds 0-4 --out /tmp/margins
    python benchmarks/learning_margins.py --seeds 0-4 --configs default,avx2-1thread -- tests/learning/test_vla_learning.py
    python benchmarks/learning_margins.py --report /tmp/margins        # the table again, from the log

A test reports through the `learning` fixture (tests/conftest.py): RLINF_LEARNING_SEED picks its
seed and RLINF_LEARNING_LOG collects `{test, seed, cpu, value, bar}` rows (value >= bar passes).
The table: per test and CPU setting, the minimum / median / maximum over seeds and how many
passed; a threshold whose minimum sits close to its bar is one CPU's luck, not a margin.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tools"))
sys.path.insert(0, str(REPO / "benchmarks"))
from _common import seeds  # noqa: E402
from portable import CONFIGS, environment  # noqa: E402  (tools/ is not a package)


def run(args: argparse.Namespace, tests: list[str]) -> None:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    log = out / "learning.jsonl"
    for config in args.configs.split(","):
        if config != "default" and config not in CONFIGS:
            raise SystemExit(f"unknown --configs entry '{config}'; choose from default, {', '.join(CONFIGS)}")
        for seed in seeds(args.seeds):
            env = environment(config)
            env.update(RLINF_LEARNING_SEED=str(seed), RLINF_LEARNING_LOG=str(log))
            cmd = [sys.executable, "-m", "pytest", "-n", str(args.workers), "--dist", "loadfile",
                   "--no-loadscope-reorder", "-q", "-p", "no:cacheprovider", "-m", "learning", *tests]
            t0 = time.monotonic()
            proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True)
            tail = proc.stdout.strip().splitlines()[-1:] or ["?"]
            print(f"{config} seed {seed}: {tail[0]} ({time.monotonic() - t0:.0f} s)", flush=True)
            (out / f"pytest_{config}_s{seed}.txt").write_text(proc.stdout + proc.stderr)


def report(log: Path) -> str:
    rows = [json.loads(x) for x in log.read_text().splitlines() if x.strip()]
    by: dict[tuple[str, str], list[dict]] = defaultdict(list)
    for r in rows:
        by[(r["test"], r["cpu"])].append(r)
    configs = ["default", *[c for c in CONFIGS if any(k[1] == c for k in by)]]
    lines = ["| test | bar | " + " | ".join(f"{c}: min / median / max (passed)" for c in configs) + " | worst margin |",
             "|---|---|" + "---|" * len(configs) + "---|"]
    for test in sorted({t for t, _ in by}):
        bar = next(r["bar"] for (t, _), rs in by.items() if t == test for r in rs)
        cells, worst = [], None
        for c in configs:
            vals = [r["value"] for r in by.get((test, c), [])]
            if not vals:
                cells.append("-")
                continue
            ok = sum(v >= bar for v in vals)
            cells.append(f"{min(vals):.3g} / {statistics.median(vals):.3g} / {max(vals):.3g} ({ok}/{len(vals)})")
            worst = min(vals) if worst is None else min(worst, min(vals))
        margin = "-" if worst is None else f"{worst - bar:+.3g}"
        lines.append(f"| {test.split('::', 1)[-1]} ({Path(test.split('::')[0]).name}) | {bar:g} | "
                     + " | ".join(cells) + f" | {margin} |")
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seeds", default="0-4", help="seeds, e.g. 0-4 or 0,3,7")
    p.add_argument("--configs", default="default," + ",".join(CONFIGS), help="CPU settings (tools/portable.py)")
    p.add_argument("--workers", type=int, default=2, help="pytest-xdist workers")
    p.add_argument("--out", default="learning_margins", help="folder for the log and pytest outputs")
    p.add_argument("--report", metavar="DIR", help="only print the table of an earlier run's log")
    args, tests = p.parse_known_args()
    tests = [t for t in tests if t != "--"]
    if args.report:
        print(report(Path(args.report) / "learning.jsonl"))
        return
    run(args, tests)
    print(report(Path(args.out) / "learning.jsonl"))


if __name__ == "__main__":
    main()
