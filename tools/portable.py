"""`make test-portable`: the numerics-sensitive tests (marker `numerics`) and every learning test
(marker `learning`, slow ones included) again, under environment variables that make this CPU
compute like a lesser or different one.

The suite was green on the machine it was written on and red on the next one twice (MKL rounding;
oneDNN's bf16 not taking effect on a Zen 4). Each variable below was checked to change results on
a Sapphire Rapids (AVX-512, AMX) before being relied on (`python benchmarks/cpu_variables.py`;
docs/benchmarks.md, "Learning-test margins and lesser-CPU runs"):

- ``MKL_ENABLE_INSTRUCTIONS=AVX2``: MKL's AVX2 kernels (a matmul's and tanh's bits change);
- ``MKL_CBWR=COMPATIBLE``: MKL's most conservative code path (bits change again, unlike
  ``AUTO,STRICT``, which rlinf sets when the variable is absent);
- ``ONEDNN_MAX_CPU_ISA=AVX2``: no bf16 kernels in oneDNN (train.bf16 falls back to autocast,
  emulated); ``AVX512_CORE_BF16``: bf16 kernels but no AMX, where oneDNN's bf16 math mode leaves
  fp32 products unrounded (as a Zen 4 did at small sizes);
- ``ATEN_CPU_CAPABILITY=avx2``: ATen's AVX2 kernels instead of AVX-512 (log_softmax's bits change);
- ``OMP_NUM_THREADS`` 1 and 2: reductions split differently across threads (a sum's bits change).

``python tools/portable.py [--config NAME] [pytest args...]`` runs the selection under each
configuration (or one); the exit code is the first failure's.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

# name -> variables set for the run (every other variable of these families is removed first)
CONFIGS: dict[str, dict[str, str]] = {
    "avx2-1thread": {"MKL_ENABLE_INSTRUCTIONS": "AVX2", "ONEDNN_MAX_CPU_ISA": "AVX2", "ATEN_CPU_CAPABILITY": "avx2",
                     "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"},
    "no-amx-compat-2threads": {"ONEDNN_MAX_CPU_ISA": "AVX512_CORE_BF16", "MKL_CBWR": "COMPATIBLE",
                               "OMP_NUM_THREADS": "2", "MKL_NUM_THREADS": "2"},
}
FAMILIES = ("MKL_", "ONEDNN_", "DNNL_", "ATEN_CPU_CAPABILITY", "OMP_NUM_THREADS")
SELECTION = "(numerics or learning) and not maniskill and not isaaclab and not libero"


def environment(name: str, base: dict[str, str] | None = None) -> dict[str, str]:
    """The process environment for configuration ``name`` (``default``: this CPU as it is)."""
    env = {k: v for k, v in (base if base is not None else os.environ).items() if not k.startswith(FAMILIES)}
    if name != "default":
        env.update(CONFIGS[name])
    env["RLINF_CPU_CONFIG"] = name
    return env


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config", choices=sorted(CONFIGS), action="append",
                   help="run only this configuration (repeatable); default: all")
    p.add_argument("--workers", default="2", help="pytest-xdist workers (-n)")
    args, rest = p.parse_known_args(argv)
    code = 0
    for name in args.config or list(CONFIGS):
        cmd = [sys.executable, "-m", "pytest", "-n", args.workers, "--dist", "loadfile", "--no-loadscope-reorder",
               "-q", "-m", SELECTION, *rest]
        print(f"== {name}: {' '.join(f'{k}={v}' for k, v in CONFIGS[name].items())}", flush=True)
        t0 = time.monotonic()
        rc = subprocess.call(cmd, cwd=REPO, env=environment(name))
        print(f"== {name}: exit {rc} in {time.monotonic() - t0:.0f} s", flush=True)
        code = code or rc
    return code


if __name__ == "__main__":
    sys.exit(main())
