"""What placing the loop on Ray costs on this machine, and what weight sync costs by model size.

1. **Per-iteration time, placed vs in-process**, each pair the same work with the same seeds (the
   runs' metrics are equal: tests/cli/test_ray_trainer_ranks.py, test_executor_ray.py), one run of
   each per repeat, interleaved:
   - CartPole PPO, 1 rank: envs in the trainer process vs envs in one Ray env-worker actor;
   - CartPole PPO, 2 ranks: `torchrun --nproc_per_node=2` vs 2 trainer-rank actors with env actors;
   - text GRPO (tiny model): sampling in the trainer vs one generation-worker actor.
   The median of `time/step_s` over iterations after the first (the first pays start-up), per run.
2. **Weight sync vs model size**: text GRPO, full fine-tuning (every weight is published after each
   update), one generation worker, `executor=local` (shared memory), `executor=local
   placement.generation.sync=broadcast` (a gloo group) and `executor=ray` (object store); `time/weight_sync_s` (the trainer's publish plus the worker's load): the median over
   the publishes after the first (the first pays one-off costs and is shown apart), for models of
   ~1M to ~135M parameters (the 135M shape is SmolLM2's width and depth budget with the task's
   small vocabulary: 576 wide, 38 layers).
3. A scaling estimate for N nodes from those parts (printed; docs/benchmarks.md keeps the latest).

    python benchmarks/cluster_overhead.py                  # all parts, 3 repeats
    python benchmarks/cluster_overhead.py --parts sync --sizes 1m 135m
    python benchmarks/cluster_overhead.py --loops text --parts placed sync --sync-repeats 1
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import RLINF, machine_line, median, table  # noqa: E402

BIN = Path(sys.executable).parent
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "RAY_AUTH_MODE": "disabled"}
QUIET = ["tracking.enabled=false", "progress=false", "eval.episodes=0", "checkpoint.interval=1000000"]
PPO_STEPS_PER_ITERATION = 64
PPO = ["num_envs=4", f"algo.rollout_steps={PPO_STEPS_PER_ITERATION}", "total_steps=4096", "seed=3", *QUIET]  # 16 iterations (8 with 2 ranks)
TEXT = ["--algo", "grpo", "sim=arithmetic", "sim.digits=2", "model=hf", "text.iterations=8", "algo.groups=4",
        "algo.group_size=4", "seed=3", "eval.best=false", *QUIET]
SYNC_ITERATIONS = 6  # 5 publishes: the first apart, the median of the other 4
SIZES = {  # name -> model overrides (model=hf's own-config preset: width, layers, heads, MLP)
    "1m": ["model.hidden_size=128", "model.layers=4", "model.heads=2", "model.kv_heads=1", "model.intermediate_size=384"],
    "5m": [],  # the tiny preset as shipped
    "30m": ["model.hidden_size=512", "model.layers=8", "model.heads=8", "model.kv_heads=4", "model.intermediate_size=1536"],
    "135m": ["model.hidden_size=576", "model.layers=38", "model.heads=9", "model.kv_heads=3",
             "model.intermediate_size=1536"],
}


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run(cmd: list[str], cwd: Path, name: str) -> list[dict]:
    """One run; its metrics rows. A failure stops the benchmark with the run's last output."""
    proc = subprocess.run([*cmd, f"run_dir={name}"], cwd=cwd, capture_output=True, text=True, env=ENV)
    if proc.returncode:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{proc.stderr[-3000:]}")
    return [json.loads(line) for line in (cwd / name / "metrics.jsonl").read_text().splitlines()]


def step_s(rows: list[dict]) -> float:
    return median([r["time/step_s"] for r in rows if "time/step_s" in r][1:])


LOOPS = ("ppo1", "ppo2", "text")


def placed(work: Path, repeats: int, loops: list[str]) -> list[tuple[str, float, float]]:
    rl = [RLINF, "rl"]
    pairs = {
        "ppo1": (
            [*rl, *PPO], [*rl, *PPO, "executor=ray", "runtime.env_workers=1"]),
        "ppo2": (
            None, [*rl, *PPO, "executor=ray", "placement.trainer.ranks=2", "runtime.env_workers=1"]),
        "text": (
            [*rl, *TEXT], [*rl, *TEXT, "executor=ray", "placement.generation.workers=1"]),
    }
    labels = {"ppo1": "CartPole PPO, 1 rank: envs in a Ray actor",
              "ppo2": "CartPole PPO, 2 ranks: Ray rank actors vs torchrun",
              "text": "text GRPO (5M): a Ray generation worker"}
    out = []
    for key in loops:
        (base, ray), label = pairs[key], labels[key]
        a, b = [], []
        for i in range(repeats):
            ref = base or [str(BIN / "torchrun"), "--nproc_per_node=2", f"--master_port={_port()}", RLINF, "rl", *PPO]
            a.append(step_s(run(ref, work, f"ref-{key}-{i}")))
            b.append(step_s(run(ray, work, f"ray-{key}-{i}")))
        out.append((label, median(a), median(b)))
        print(f"{label}: {median(a) * 1e3:.1f} ms vs {median(b) * 1e3:.1f} ms per iteration", flush=True)
    return out


def params(work: Path, name: str) -> int:
    from safetensors import safe_open

    total = 0
    with safe_open(str(work / name / "checkpoints" / "final" / "hf" / "model.safetensors"), "pt") as f:
        for k in f.keys():
            total += _numel(f.get_slice(k).get_shape())
    return total


def _numel(shape: list[int]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


# weight-sync modes timed side by side: label -> overrides (placement.generation.sync, docs/runtime.md)
SYNC_MODES = {
    "shared memory": ["executor=local"],
    "gloo broadcast": ["executor=local", "placement.generation.sync=broadcast"],
    "Ray object store": ["executor=ray"],
}


def sync(work: Path, sizes: list[str], repeats: int) -> list[tuple[str, int, dict, dict]]:
    """Per size: (name, parameters, {mode: median s}, {mode: first publish s})."""
    out = []
    for size in sizes:
        cmd = [RLINF, "rl", *TEXT, f"text.iterations={SYNC_ITERATIONS}", *SIZES[size],
               "placement.generation.workers=1", "checkpoint.interval=1000000"]
        steady: dict[str, list[float]] = {m: [] for m in SYNC_MODES}
        first: dict[str, list[float]] = {m: [] for m in SYNC_MODES}
        n = 0
        for i in range(repeats):
            for mode, extra in SYNC_MODES.items():
                name = f"sync-{size}-{mode.split()[0].lower()}-{i}"
                rows = run([*cmd, *extra], work, name)
                # iteration 1 publishes nothing; the first publish pays one-off costs (shared pages
                # touched, Ray's first transfer to the worker): reported apart, not in the median
                syncs = [r["time/weight_sync_s"] for r in rows if "time/weight_sync_s" in r][1:]
                first[mode].append(syncs[0])
                steady[mode].append(median(syncs[1:]))
                n = n or params(work, name)
        med = {m: median(v) for m, v in steady.items()}
        fst = {m: median(v) for m, v in first.items()}
        out.append((size, n, med, fst))
        print(f"{size}: {n / 1e6:.1f}M parameters, sync " + " / ".join(f"{v * 1e3:.0f} ms ({m})" for m, v in med.items())
              + "; first publish " + " / ".join(f"{v * 1e3:.0f}" for v in fst.values()) + " ms", flush=True)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--parts", nargs="+", default=["placed", "sync"], choices=["placed", "sync"])
    p.add_argument("--sizes", nargs="+", default=list(SIZES), choices=list(SIZES))
    p.add_argument("--loops", nargs="+", default=list(LOOPS), choices=LOOPS, help="which placed-vs-in-process pairs")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--sync-repeats", type=int, default=2)
    p.add_argument("--out", type=Path, default=None, help="keep the runs here (default: a temporary folder)")
    p.add_argument("--placed-from", type=Path, default=None,
                   help="cluster_overhead.json of an earlier --parts placed run: its rows feed the estimate")
    a = p.parse_args()
    print(machine_line())
    with tempfile.TemporaryDirectory() as tmp:
        work = (a.out or Path(tmp)).resolve()
        work.mkdir(parents=True, exist_ok=True)
        result: dict = {}
        if "placed" in a.parts:
            rows = placed(work, a.repeats, a.loops)
            result["placed"] = rows
            print("\n" + table(["loop", "in-process ms/it", "Ray-placed ms/it", "ratio"],
                               [(lbl, x * 1e3, y * 1e3, f"{y / x:.2f}x") for lbl, x, y in rows]))
        if "sync" in a.parts:
            rows2 = sync(work, a.sizes, a.sync_repeats)
            result["sync"] = rows2
            print("\n" + table(["model", "parameters", "MB (fp32)", *(f"{m} ms" for m in SYNC_MODES),
                                "first publish ms: " + " / ".join(SYNC_MODES)],
                               [(s, f"{n / 1e6:.1f}M", n * 4 / 1e6, *(med[m] * 1e3 for m in SYNC_MODES),
                                 " / ".join(f"{fst[m] * 1e3:.0f}" for m in SYNC_MODES)) for s, n, med, fst in rows2]))
        if "placed" not in result and a.placed_from is not None:  # an earlier run's placed part, for the estimate
            result["placed"] = json.loads(a.placed_from.read_text()).get("placed")
        (work / "cluster_overhead.json").write_text(json.dumps(result, indent=1))
        if result.get("placed") and "sync" in result:
            estimate(result)


def estimate(result: dict) -> None:
    """A first-order estimate for N nodes from the measured parts: what grows with N and what does not."""
    placed_rows = {label.split(":")[0]: (x, y) for label, x, y in result["placed"]}
    _, n, med, _ = result["sync"][-1]
    shm_s, ray_s, bcast_s = med["shared memory"], med["Ray object store"], med["gloo broadcast"]
    gb = n * 4 / 1e9
    print(f"\nscaling estimate from these measurements ({n / 1e6:.0f}M fp32 parameters = {gb:.2f} GB a version):")
    if "CartPole PPO, 1 rank" in placed_rows:
        x, y = placed_rows["CartPole PPO, 1 rank"]
        per_step = (y - x) / PPO_STEPS_PER_ITERATION
        print(f"- an env placed in a Ray actor costs ~{per_step * 1e3:.1f} ms a vectorised step (one round trip): "
              f"worth it where a step costs more than that (physics, rendering), whatever N")
    if "text GRPO (5M)" in placed_rows:
        x, y = placed_rows["text GRPO (5M)"]
        print(f"- a generation worker in a Ray actor adds {max(y - x, 0) * 1e3:.0f} ms an iteration "
              f"({y / x:.2f}x): fixed per iteration, not per node")
    print(f"- a weight version reached one worker in {shm_s * 1e3:.0f} ms through shared memory (same machine) and "
          f"{ray_s * 1e3:.0f} ms through Ray's object store ({bcast_s * 1e3:.0f} ms by a gloo broadcast, one "
          f"collective per version whatever the worker count); Ray ships an object to each node once (its object "
          f"manager pulls chunks from every node that already holds them), so N nodes get a version in about "
          f"that plus the link's transfer time, not N times it:")
    for gbit in (10, 100):
        link = gb / (gbit / 8)
        allreduce = 2 * link  # a ring all-reduce moves ~2x the gradient bytes per rank, independent of N
        print(f"  {gbit} Gbit/s: sync ~{ray_s + link:.2f} s per version by the object store (~{bcast_s + link:.2f} s by "
              f"a broadcast whose root sends once; up to ~{bcast_s:.2f} s + N x {link:.2f} s if it sends to each "
              f"member in turn: not measured across machines), gradient all-reduce ~{allreduce:.2f} s per update "
              f"(ring, full fine-tuning; LoRA moves only the adapter)")
    print("- per iteration: max(sampling / generation workers, update / trainer ranks + all-reduce) + sync; at "
          "max_staleness=1 sampling overlaps the update, so with enough generation workers the iteration is the "
          "update plus all-reduce plus sync")


if __name__ == "__main__":
    main()
