"""Does a refactor change what rlinf computes? Seeded runs (PPO, GRPO, SAC, BC, text GRPO, VLA PPO,
plus RLOO, REINFORCE++ and a resume) leave metrics and weights; this records them so that two trees can be
compared bit for bit.

    python benchmarks/house_identity.py --out before.json          # on the old tree
    python benchmarks/house_identity.py --out after.json --compare before.json

Metrics are every value of metrics.jsonl except wall-clock ones (``time/*``, throughput); weights are
the sha256 of every tensor of the final checkpoint. The side-by-side table says, per run, whether the
metrics and the weights are identical, and names the first difference.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import RLINF, machine_line  # noqa: E402

QUIET = ["tracking.enabled=false", "progress=false"]
HF = ["model=hf", "model.hidden_size=64", "model.layers=2", "model.heads=2", "model.kv_heads=1",
      "model.intermediate_size=128"]
VLA = ["model=vla", "model.backbone.hidden_size=64", "model.backbone.layers=2", "model.backbone.heads=2",
       "model.backbone.kv_heads=1", "model.backbone.intermediate_size=128"]
REACH = ["sim=metaworld", "sim.task=reach-v3", "sim.max_episode_steps=60"]

# name -> list of (stage, args...) commands; the last command's run_dir is the one compared
RUNS: dict[str, list[list[str]]] = {
    "ppo_cartpole": [["rl", "--algo", "ppo", "total_steps=4096", "seed=1", "run_dir=run"]],
    "ppo_cartpole_resume": [["rl", "--algo", "ppo", "total_steps=2048", "seed=2", "checkpoint.interval=1",
                             "checkpoint.keep=10", "run_dir=full"],
                            ["rl", "resume=full/checkpoints/iter_000001", "run_dir=run"]],
    "ppo_pendulum_fp32": [["rl", "--algo", "ppo", "sim.env_id=Pendulum-v1", "total_steps=4096", "seed=1",
                           "run_dir=run"]],
    "grpo_cartpole": [["rl", "--algo", "grpo", "algo.groups=2", "algo.group_size=4", "total_steps=3000", "seed=1",
                       "run_dir=run"]],
    "rloo_cartpole": [["rl", "--algo", "rloo", "algo.groups=2", "algo.group_size=4", "total_steps=2000", "seed=1",
                       "run_dir=run"]],
    "reinforcepp_cartpole": [["rl", "--algo", "reinforce++", "algo.groups=2", "algo.group_size=4", "total_steps=2000",
                              "seed=1", "run_dir=run"]],
    "sac_pendulum": [["rl", "--algo", "sac", "sim.env_id=Pendulum-v1", "total_steps=1500", "algo.warmup_steps=500",
                      "seed=1", "run_dir=run"]],
    "bc_cartpole": [["collect", "policy=expert", "episodes=8", "output=data", "seed=0"],
                    ["sft", "algo=bc", "dataset=data", "algo.epochs=3", "eval.episodes=2", "seed=1", "run_dir=run"]],
    "grpo_text": [["collect", "sim=arithmetic", "sim.digits=1", "policy=expert", "episodes=200", "output=add.jsonl"],
                  ["sft", "dataset=add.jsonl", *HF, "algo.epochs=1", "algo.minibatch_size=32", "eval.episodes=8",
                   "seed=0", "run_dir=sft"],
                  ["rl", "--algo", "grpo", "init=sft/checkpoints/best", "text.iterations=3", "algo.groups=4",
                   "algo.group_size=4", "eval.episodes=8", "seed=1", "run_dir=run"]],
    "vla_ppo_reach": [["collect", *REACH, "policy=expert", "episodes=4", "num_envs=2", "output=data"],
                      ["sft", *VLA, "dataset=data", "algo.epochs=2", "algo.minibatch_size=64", "eval.episodes=1",
                       "seed=0", "run_dir=sft"],
                      ["rl", "--algo", "ppo", "init=sft/checkpoints/best", "num_envs=2", "algo.rollout_steps=32",
                       "total_steps=128", "algo.minibatch_size=32", "sim.reward=shaped", "eval.episodes=1",
                       "seed=1", "run_dir=run"]],
}

WALL_CLOCK = ("time/", "throughput", "seconds", "per_sec", "fps", "sps")


def _steady(row: dict) -> dict:
    return {k: v for k, v in row.items() if not any(w in k for w in WALL_CLOCK)}


def _weights(run: Path) -> dict[str, str]:
    from safetensors.numpy import load_file

    final = run / "checkpoints" / "final"
    if not final.is_dir():
        final = run / "checkpoints" / "best"
    out = {}
    for f in sorted(final.rglob("*.safetensors")):
        for k, v in sorted(load_file(str(f)).items()):
            out[f"{f.relative_to(final)}:{k}"] = hashlib.sha256(v.tobytes()).hexdigest()[:16]
    return out


def measure(name: str, commands: list[list[str]]) -> dict:
    with tempfile.TemporaryDirectory(prefix=f"identity-{name}-") as tmp:
        for cmd in commands:
            res = subprocess.run([RLINF, *cmd, *QUIET], cwd=tmp, capture_output=True, text=True)
            if res.returncode != 0:
                return {"error": f"{' '.join(cmd)} -> exit {res.returncode}: {res.stderr.strip()[-400:]}"}
        run = Path(tmp) / "run"
        rows = [_steady(json.loads(line)) for line in (run / "metrics.jsonl").read_text().splitlines()]
        return {"metrics": rows, "weights": _weights(run)}


def _first_difference(a: dict, b: dict) -> str:
    if "error" in a or "error" in b:
        return a.get("error") or b.get("error")
    if len(a["metrics"]) != len(b["metrics"]):
        return f"{len(a['metrics'])} vs {len(b['metrics'])} metric rows"
    for i, (ra, rb) in enumerate(zip(a["metrics"], b["metrics"])):
        if ra != rb:
            keys = sorted(set(ra) | set(rb))
            k = next(k for k in keys if ra.get(k) != rb.get(k))
            return f"row {i} {k}: {ra.get(k)} vs {rb.get(k)}"
    if a["weights"] != b["weights"]:
        k = next(k for k in sorted(set(a["weights"]) | set(b["weights"])) if a["weights"].get(k) != b["weights"].get(k))
        return f"weight {k}"
    return ""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--compare", help="a JSON written by an earlier --out (the other tree)")
    ap.add_argument("--only", nargs="*", help="run names (default: all)")
    args = ap.parse_args()
    names = args.only or list(RUNS)
    print(machine_line())
    got = {}
    for name in names:
        got[name] = measure(name, RUNS[name])
        print(f"{name}: {'error' if 'error' in got[name] else 'ok'}", flush=True)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    Path(args.out).write_text(json.dumps({"commit": commit, "runs": got}, indent=1))
    if not args.compare:
        return
    before = json.loads(Path(args.compare).read_text())
    print(f"\n| run | metric rows | tensors | {before['commit']} vs {commit} |")
    print("|---|---:|---:|---|")
    same = 0
    for name in names:
        a, b = before["runs"].get(name), got[name]
        if a is None:
            print(f"| {name} | | | not in {args.compare} |")
            continue
        diff = _first_difference(a, b)
        same += not diff
        print(f"| {name} | {len(b.get('metrics', []))} | {len(b.get('weights', {}))} | "
              f"{'bit-identical' if not diff else diff} |")
    print(f"\n{same}/{len(names)} runs bit-identical")
    sys.exit(0 if same == len(names) else 1)


if __name__ == "__main__":
    main()
