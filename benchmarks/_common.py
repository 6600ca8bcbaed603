"""Helpers shared by the benchmark scripts: machine load, medians, a results table."""

from __future__ import annotations

import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Sequence

RLINF = str(Path(sys.executable).with_name("rlinf"))


def machine_line() -> str:
    load = os.getloadavg() if hasattr(os, "getloadavg") else (float("nan"),) * 3
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:
        cores = os.cpu_count() or 0
    return (f"{time.strftime('%Y-%m-%d %H:%M')}  {platform.python_version()}  {cores} cores  "
            f"load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")


def seeds(text: str) -> list[int]:
    """``"0-3,7"`` -> [0, 1, 2, 3, 7]: the seed lists benchmark flags take."""
    out: list[int] = []
    for part in text.split(","):
        lo, _, hi = part.partition("-")
        out.extend(range(int(lo), int(hi or lo) + 1))
    return out


def median(xs: Sequence[float]) -> float:
    return float(statistics.median(xs)) if xs else float("nan")


def table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    cells = [[str(h) for h in headers]] + [[_fmt(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    lines = ["  ".join(c.rjust(w) if j else c.ljust(w) for j, (c, w) in enumerate(zip(r, widths))) for r in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def _fmt(x: object) -> str:
    if isinstance(x, float):
        return f"{x:,.0f}" if abs(x) >= 100 else f"{x:.2f}"
    return str(x)


def run_stage(args: list[str], log: Path) -> dict:
    """One `rlinf` stage as a subprocess, its output appended to ``log``; returns its result.json
    (with the wall time as ``wall_s`` and the CPU time of the stage's processes as ``cpu_s``). A failed stage raises RuntimeError naming the log."""
    t0 = time.time()
    with open(log, "a") as f:
        f.write(f"$ rlinf {' '.join(args)}\n")
        f.flush()
        proc = subprocess.Popen([RLINF, *args], stdout=f, stderr=subprocess.STDOUT)
        # wait4, not wait: the stage's CPU time (its own and its waited-for worker processes'),
        # which threads running stages side by side cannot split out of RUSAGE_CHILDREN
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise RuntimeError(f"rlinf {args[0]} failed (exit {proc.returncode}); see {log}")
    run_dir = next(a.split("=", 1)[1] for a in args if a.startswith("run_dir="))
    result = json.loads((Path(run_dir) / "result.json").read_text())
    result["wall_s"] = time.time() - t0
    result["cpu_s"] = usage.ru_utime + usage.ru_stime
    return result
