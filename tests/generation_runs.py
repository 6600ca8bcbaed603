"""What the generation-worker tests share (tests/cli/test_generation_workers.py, test_executor_ray.py):
a short GRPO run on two-digit sums and how two runs are compared."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

TINY = ["model=hf", "model.hidden_size=64", "model.layers=2", "model.heads=2", "model.kv_heads=1",
        "model.intermediate_size=128"]
QUIET = ["tracking.enabled=false", "progress=false"]
# two-digit sums: prompts of several lengths, so a batch is padded and max_staleness=0 may split it
GRPO = ["--algo", "grpo", "sim=arithmetic", "sim.digits=2", *TINY, "text.iterations=3", "algo.groups=4",
        "algo.group_size=4", "eval.episodes=4", "seed=3", *QUIET]
RLINF = str(Path(sys.executable).with_name("rlinf"))
GENERATION_KEYS = ("rollout/weight_version_lag", "rollout/runtime/generation_", "time/")


def rows(run_dir: Path, drop: tuple[str, ...] = GENERATION_KEYS) -> list[dict]:
    """metrics.jsonl without wall-clock columns and the columns only generation workers write."""
    return [{k: v for k, v in json.loads(line).items() if not k.startswith(drop)}
            for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def column(run_dir: Path, key: str) -> list[float]:
    return [m[key] for m in map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines()) if key in m]


def weights(run_dir: Path, name: str = "hf/model.safetensors") -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(str(run_dir / "checkpoints" / "final" / name))


def assert_same_run(a: Path, b: Path, name: str = "hf/model.safetensors") -> None:
    assert rows(a) == rows(b)
    wa, wb = weights(a, name), weights(b, name)
    assert wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)


def splits(run_output: str) -> bool:
    """Whether a max_staleness=0 run split batches over its workers: where this machine's kernels give
    a part of a batch the whole batch's bits (the run's start note says when they do not)."""
    return "batches are not split" not in run_output
