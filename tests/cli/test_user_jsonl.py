"""A reasoning team's own GSM8K-style JSONL (question, worked answer ending in ``#### n``), not shipped
with rlinf, through the whole loop on a tiny model: collect SFT rows from its worked solutions,
sft, GRPO from the SFT checkpoint, eval. Each stage reads the user's file, keeps its held-out rows
out of training, and the task travels with the checkpoints (rl and eval need no sim= again)."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

TINY = ["model=hf", "model.hidden_size=32", "model.layers=1", "model.heads=2", "model.kv_heads=1",
        "model.intermediate_size=64"]
QUIET = ["tracking.enabled=false", "progress=false"]


def _user_file(path: Path, n: int = 240) -> list[dict]:
    """The three kinds of rows the issue's user had: 3-digit subtraction, one-digit products, word problems."""
    rng = random.Random(7)
    rows = []
    for i in range(n):
        kind = i % 3
        if kind == 0:
            a, b = rng.randint(500, 999), rng.randint(100, 499)
            q, work, ans = f"What is {a} - {b}?", f"{a} - {b} = {a - b}", a - b
        elif kind == 1:
            a, b = rng.randint(2, 9), rng.randint(2, 9)
            q, work, ans = f"What is {a} times {b}?", f"{a} * {b} = {a * b}", a * b
        else:
            a, b = rng.randint(10, 60), rng.randint(2, 9)
            q = f"Sam has {a} apples and buys {b} bags of 3 apples each. How many apples does Sam have now?"
            work, ans = f"{b} bags of 3 is {3 * b}. {a} + {3 * b} = {a + 3 * b}.", a + 3 * b
        if all(r["question"] != q for r in rows):  # one row per question, as a curated file has
            rows.append({"question": q, "answer": f"{work}\n#### {ans}"})
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return rows


@pytest.mark.slow
def test_user_jsonl_collect_sft_grpo_eval(cli, workdir):
    rows = _user_file(workdir / "my_math.jsonl")
    task = ["sim=jsonl", "sim.path=my_math.jsonl", "sim.max_new_tokens=24"]

    # SFT rows from the user's worked solutions (training split only) and a meta file naming the task
    r = cli("collect", *task, "policy=expert", "episodes=96", "output=data/sft.jsonl", *QUIET)
    assert r.code == 0, r.err
    sft_rows = [json.loads(line) for line in (workdir / "data/sft.jsonl").read_text().splitlines()]
    assert len(sft_rows) == 96
    assert all("####" in row["completion"] for row in sft_rows)  # the worked solution, not the bare number
    assert "my_math.jsonl" in (workdir / "data/sft.jsonl.meta.json").read_text()  # the task travels with the data

    r = cli("sft", "dataset=data/sft.jsonl", *TINY, "algo.epochs=2", "algo.minibatch_size=16", "algo.lr=3e-3",
            "eval.episodes=8", "run_dir=sft", *QUIET)
    assert r.code == 0, r.err
    sft = json.loads((workdir / "sft/result.json").read_text())
    losses = [json.loads(line)["train/loss"] for line in (workdir / "sft/metrics.jsonl").read_text().splitlines()
              if "train/loss" in line]
    assert losses[-1] < losses[0]  # it learned the format of the user's solutions
    assert 0.0 <= sft["eval"]["accuracy"] <= 1.0  # scored on the file's held-out rows after training

    # GRPO from the SFT checkpoint: the task (the user's file) comes from the checkpoint
    r = cli("rl", "--algo", "grpo", "init=sft/checkpoints/best", "text.iterations=2", "algo.groups=2",
            "algo.group_size=4", "algo.epochs=1", "algo.lr=1e-3", "sim.format_reward=0.5", "eval.episodes=8",
            "run_dir=rl", *QUIET)
    assert r.code == 0, r.err
    assert "my_math.jsonl" in (workdir / "rl/checkpoints/final/rlinf.yaml").read_text()

    r = cli("eval", "checkpoint=rl/checkpoints/final", "episodes=12", "text.examples=12", *QUIET)
    assert r.code == 0, r.err
    assert 0.0 <= r.json_tail()["accuracy"] <= 1.0
    result = json.loads(next((workdir / "rlinf_runs/eval").glob("*/result.json")).read_text())
    asked = [e["prompt"] for e in result["examples"]]
    # the user's own questions in the template of the file's task ("{question}\n", handed from checkpoint to
    # checkpoint unchanged) ...
    assert len(set(asked)) == 12 and set(asked) <= {row["question"] + "\n" for row in rows}
    assert not set(asked) & {row["prompt"] for row in sft_rows}  # ... from its held-out rows, never trained on
