"""`rlinf rl eval.best=true` (the default): validations on their own seeds choose checkpoints/best.

What must hold: the kept policy is the one that scored highest in the validations logged (a tie
goes to the later one); evaluating that checkpoint on the validation seeds gives the validation's
score again (so the validation ran on those seeds and the right weights were saved); the final
evaluation of it is on the test seeds; a resumed run keeps comparing against the best so far.
"""

from __future__ import annotations

import json
from pathlib import Path

ITERS = 12
ARGS = ["algo.rollout_steps=64", "num_envs=4", "seed=3", "progress=false", "tracking.enabled=false",
        "algo.epochs=4", "algo.minibatch_size=64", f"total_steps={64 * 4 * ITERS}", "eval.episodes=3",
        "eval.best=true", "eval.interval=3", "eval.val_episodes=3", "eval.val_seed=2000000",
        "checkpoint.interval=3", "checkpoint.keep=100"]


def _validations(run_dir: Path) -> list[tuple[int, float]]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [(int(r["iteration"]), r["val/return_mean"]) for r in rows if "val/return_mean" in r]


def _training(run_dir: Path) -> list[dict]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    rows = [{k: v for k, v in r.items() if k.startswith(("train/", "rollout/"))} for r in rows]
    return [r for r in rows if r]


def _ok(res, run_dir: Path | None = None) -> dict:
    assert res.code == 0, res.err[-3000:]
    return json.loads((run_dir / "result.json").read_text()) if run_dir else res.json_tail()


def test_the_best_validation_is_kept_and_reproduces_on_its_seeds(cli_proc, workdir):
    result = _ok(cli_proc("rl", *ARGS, "run_dir=run"), workdir / "run")
    vals = _validations(workdir / "run")
    assert [it for it, _ in vals] == list(range(0, ITERS + 1, 3))  # the start is a candidate too
    top = max(score for _, score in vals)
    expected = max(it for it, score in vals if score == top)
    best = result["best"]
    assert (best["iteration"], best["metric"], best["score"]) == (expected, "return_mean", top), vals
    assert (workdir / best["checkpoint"]).resolve() == workdir / "run/checkpoints/best"
    assert len({score for _, score in vals}) > 1, vals  # the choice was a real one
    # validating changes nothing about training: the same run without it, iteration by iteration
    plain = [a for a in ARGS if not a.startswith(("eval.best", "eval.interval", "eval.val"))] + ["eval.best=false"]
    _ok(cli_proc("rl", *plain, "run_dir=plain"), workdir / "plain")
    assert _training(workdir / "plain") == _training(workdir / "run")

    # the kept weights, on the validation seeds, score what the validation measured
    ckpt = workdir / "run/checkpoints/best"
    again = _ok(cli_proc("eval", f"checkpoint={ckpt}", "episodes=3", "seed=2000000", "num_envs=4",
                         "tracking.enabled=false", "run_dir=ev_val"))
    assert again["return_mean"] == top
    # and its final evaluation is on the test seeds, as `rlinf eval` measures it
    test = _ok(cli_proc("eval", f"checkpoint={ckpt}", "episodes=3", "seed=1000000", "num_envs=4",
                        "tracking.enabled=false", "run_dir=ev_test"))
    assert best["eval"]["return_mean"] == test["return_mean"]

    # resumed into another directory from checkpoints after the first validations: the same choice
    # (the best so far is part of the run's state, its weights come along: from the source's best
    # when that is still the one, else from the periodic checkpoint of its iteration)
    for it in (3, 6):
        res = cli_proc("rl", f"resume={workdir / f'run/checkpoints/iter_{it:06d}'}", f"run_dir=resumed{it}")
        resumed = _ok(res, workdir / f"resumed{it}")
        assert {k: resumed["best"][k] for k in ("iteration", "score")} == {k: best[k] for k in ("iteration", "score")}
        assert json.loads((workdir / f"resumed{it}/checkpoints/best/best.json").read_text())["iteration"] == expected


def test_best_without_validation_episodes_is_refused_before_anything_runs(cli_proc, workdir):
    res = cli_proc("rl", "eval.val_episodes=null", "eval.episodes=0", "tracking.enabled=false", "run_dir=nothing")
    assert res.code == 2 and "Traceback" not in res.err, res.err
    assert [line for line in res.err.splitlines() if line.strip()] == [
        "error: eval.best=true needs validation episodes: set eval.val_episodes=N (or eval.episodes=N)"]
    assert not (workdir / "nothing").exists()
