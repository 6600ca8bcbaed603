"""RL that never loses the clone: `rlinf rl init=<clone>` keeps the policy that is best on validation
seeds by default, the clone included, and says which (`kept: init`, `kept: iteration N`).

What must hold: a run whose learning rate only wrecks the clone keeps the clone's very weights and
says in one line that it ended below its start; `eval.best=false` keeps the last policy; the
validation seeds are apart from the training seeds and the final evaluation's (refused otherwise,
in `rl` and in `pipeline`); a resumed run keeps the best so far and the start's score.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import cartpole_clone

# CartPole, PPO at a learning rate no policy survives (Adam moves every weight by ~1 per step),
# actor updates from the first iteration (no critic warm-up): 2 iterations of 4 x 128 steps.
HARMFUL = ["algo.lr=1.0", "algo.critic_warmup_iters=0", "num_envs=4", "algo.rollout_steps=128",
           "total_steps=1024", "eval.episodes=5", "progress=false", "tracking.enabled=false"]


@pytest.fixture(scope="module")
def clone(tmp_path_factory) -> Path:
    """A CartPole policy cloned from 4 expert episodes: good (hundreds of steps), not perfect."""
    return cartpole_clone(tmp_path_factory.mktemp("clone"), sft_epochs=30)


def _tensors(path: Path) -> dict:
    from safetensors.numpy import load_file

    return load_file(str(path / "model.safetensors"))


def _same_actor(kept: Path, clone: Path) -> bool:
    """The kept checkpoint holds the clone's weights (it gained a fresh critic for PPO: ignored)."""
    a, b = _tensors(kept), _tensors(clone)
    return all(k in a and (a[k] == v).all() for k, v in b.items())


def _warnings(err: str) -> list[str]:
    return [line for line in err.splitlines() if line.startswith("warning: RL ended below its start")]


def test_a_harmful_learning_rate_keeps_the_clone_and_says_so(cli, workdir, clone):
    res = cli("rl", f"init={clone}", *HARMFUL, "run_dir=run")
    assert res.code == 0, res.err[-3000:]
    result = json.loads((workdir / "run/result.json").read_text())
    assert result["kept"] == "init" and result["below_start"] is True
    best = result["best"]
    assert best["iteration"] == 0 and Path(best["checkpoint"]) == Path("run/checkpoints/best")
    assert _same_actor(workdir / "run/checkpoints/best", clone)
    # the last policy is the wrecked one; the kept one, on the same held-out seeds, is far better
    assert result["eval"]["return_mean"] < 0.5 * best["eval"]["return_mean"], result
    rows = [json.loads(line) for line in (workdir / "run/metrics.jsonl").read_text().splitlines()]
    vals = [(r["iteration"], r["val/return_mean"]) for r in rows if "val/return_mean" in r]
    assert [it for it, _ in vals] == [0, 2] and vals[1][1] < vals[0][1]  # the start and the last
    assert "ppo kept: init" in res.out  # the table's row
    lines = _warnings(res.err)
    assert len(lines) == 1 and lines[0].endswith("kept: init"), res.err
    assert f"{vals[1][1]:.3g} < {vals[0][1]:.3g}" in lines[0]


def test_keep_last_overrides(cli, workdir, clone):
    res = cli("rl", f"init={clone}", *HARMFUL, "eval.best=false", "run_dir=run")
    assert res.code == 0, res.err[-3000:]
    result = json.loads((workdir / "run/result.json").read_text())
    assert result["kept"] == "last" and "best" not in result and not result["below_start"]
    assert not (workdir / "run/checkpoints/best").exists()
    rows = [json.loads(line) for line in (workdir / "run/metrics.jsonl").read_text().splitlines()]
    assert not any(k.startswith("val/") for r in rows for k in r)  # no validation ran: the old cost
    assert not _warnings(res.err) and "kept:" not in res.out
    from rlinf_cli.stages.pipeline import _kept

    assert _kept(result) == result["checkpoint"] == "run/checkpoints/final"  # what a pipeline hands on


def test_a_resumed_run_keeps_the_best_and_the_start(cli, workdir, clone):
    """Resumed after the first (harmful) iteration, into another directory: the clone stays the
    kept policy, its weights come along, and the decline is measured from the original start."""
    first = cli("rl", f"init={clone}", *HARMFUL, "checkpoint.interval=1", "checkpoint.keep=10", "run_dir=run")
    assert first.code == 0, first.err[-3000:]
    res = cli("rl", f"resume={workdir / 'run/checkpoints/iter_000001'}", "run_dir=resumed")
    assert res.code == 0, res.err[-3000:]
    result = json.loads((workdir / "resumed/result.json").read_text())
    assert result["kept"] == "init" and result["below_start"] is True and result["best"]["iteration"] == 0
    assert _same_actor(workdir / "resumed/checkpoints/best", clone)
    assert len(_warnings(res.err)) == 1


def test_validation_seeds_apart_from_training_and_the_final_evaluation(cli):
    from rlinf_cli.collectors.base import training_seeds
    from rlinf_cli.runtime.vector import TRAIN_SEED_SPACE, episode_seed
    from rlinf_cli.validate import TRAIN_SEEDS

    assert TRAIN_SEEDS == TRAIN_SEED_SPACE
    assert max(training_seeds(7, 3, 1000)) < TRAIN_SEEDS and max(episode_seed(5, k) for k in range(1, 500)) < TRAIN_SEEDS
    cases = [
        (["rl", "eval.val_seed=999998"], "eval.val_seed=999998: validation seeds 999,998..1,000,007 would be training "
                                         "seeds (those are below 1,000,000); set eval.val_seed >= 1000000"),
        (["rl", "eval.val_seed=1000008", "eval.episodes=10"],
         "validation seeds 1,000,008..1,000,017 (eval.val_seed, eval.val_episodes) overlap the final evaluation's "
         "1,000,000..1,000,009: set eval.val_seed=1000010 or above (or eval.best=false to keep the last policy)"),
        # the pipeline's eval step measures on its own seeds: the rl step's validation stays apart from them
        (["pipeline", "eval.seed=2000003", "eval.episodes=5"],
         "validation seeds 2,000,000..2,000,009 (eval.val_seed, eval.val_episodes) overlap the final evaluation's "
         "2,000,003..2,000,007: set eval.val_seed=2000008 or above (or eval.best=false to keep the last policy)"),
        # a text task: seeds from 1,000,000 to 2,000,000 draw its held-out prompts, which the final evaluation scores
        (["rl", "--algo", "grpo", "sim=arithmetic", "model=hf", "eval.val_seed=1500000"],
         "eval.val_seed=1500000: on a text task validation seeds start at 2,000,000 (they draw training-split "
         "prompts; seeds below it draw the held-out prompts the final evaluation scores): set eval.val_seed >= 2000000"),
        (["rl", "--algo", "grpo", "sim=arithmetic", "model=hf", "eval.episodes=0"],
         "eval.best=true needs validation episodes: set text.val_episodes=N (or eval.episodes=N)"),
        (["rl", "eval.best_p=0"], "bad value for 'eval.best_p': 0; it must be a p-value in (0, 1], or null"),
    ]
    for args, message in cases:
        res = cli(*args, "tracking.enabled=false")
        assert res.code == 2 and "Traceback" not in res.err, res.err
        assert [line for line in res.err.splitlines() if line.strip()] == [f"error: {message}"], res.err
    # apart: accepted (eval.best=false: nothing to keep apart)
    from rlinf_cli.config import compose
    from rlinf_cli.validate import check_best, validation_episodes

    check_best(compose("rl", ["eval.val_seed=1000010", "eval.episodes=10"]))
    check_best(compose("rl", ["eval.val_seed=999998", "eval.best=false"]))
    text = compose("rl", ["sim=arithmetic", "model=hf", "eval.episodes=0", "text.val_episodes=32"])
    check_best(text)
    assert validation_episodes(text, text=True) == 32 and validation_episodes(text) == 10


def test_a_tie_with_the_clone_keeps_the_clone_and_a_tie_between_rl_iterations_the_later():
    from rlinf_cli.stages.keep import beats

    clone = {"score": 1.0, "iteration": 0}
    assert not beats(1.0, clone, from_init=True)  # RL must score higher than the clone to replace it
    assert beats(1.0, clone, from_init=False)  # a from-scratch start is no clone: the more trained wins
    assert beats(0.9, None, from_init=True) and not beats(0.9, clone, from_init=True)
    assert beats(1.0, {"score": 1.0, "iteration": 40}, from_init=True)  # RL vs RL: the later
    assert not beats(0.5, {"score": 0.6, "iteration": 40}, from_init=True)
    # a from-scratch sparse task validates 0 for a while: the latest of those zeros is kept, not the random start
    assert beats(0.0, {"score": 0.0, "iteration": 0}, from_init=False)


def test_the_pipeline_summary_names_the_kept_policy():
    from rlinf_cli.stages.common import table_text
    from rlinf_cli.stages.pipeline import _summary, kept_label

    assert kept_label({"kept": "init"}) == "sft" and kept_label({"kept": "iteration 120"}) == "iteration 120"
    assert kept_label({"checkpoint": "x"}) == "last"  # an rl result from before eval.best
    s = {"episodes": 5.0, "return_mean": 9.0, "return_std": 0.0, "length_mean": 9.0}
    summaries = {"random": s, "expert": s, "sft": s, "sft + rl": s}
    timings = {"expert": 0.0, "collect": 1.0, "sft": 2.0, "rl": 3.0}
    text = table_text(_summary("t", summaries, timings, "sft", "warning: the rl step ended below the clone"))
    assert "sft + rl (kept: sft)" in text and "warning: the rl step ended below the clone" in text
    text = table_text(_summary("t", summaries, timings, "last"))
    assert "kept" not in text and "sft + rl " in text


@pytest.mark.slow
def test_the_pipeline_keeps_the_clone_when_rl_only_degrades(cli, workdir):
    res = cli("pipeline", "collect.episodes=4", "sft.algo.epochs=30", *(f"rl.{a}" for a in HARMFUL[:5]),
              "eval.episodes=5", "progress=false", "tracking.enabled=false")
    assert res.code == 0, res.err[-3000:]
    summary = json.loads(next((workdir / "rlinf_runs/pipeline").glob("*/summary.json")).read_text())
    assert summary["kept"] == "sft" and summary["below_start"] is True
    assert summary["eval"]["sft + rl"] == summary["eval"]["sft"]  # the clone's weights, the same seeds
    assert "sft + rl (kept: sft)" in res.out
    assert "warning: the rl step ended below the clone on validation; kept: sft" in res.out


def test_the_sign_test_counts_the_seeds_where_two_policies_differ():
    from rlinf_cli.stages.keep import sign_test

    base = {s: 0.0 for s in range(10)}
    assert sign_test({**base, 0: 1.0}, base) == 0.5  # one seed won, none lost: a coin flip
    assert sign_test({**base, 0: 1.0, 1: 1.0, 2: 1.0}, base) == 0.125
    assert sign_test({**base, 0: 1.0, 1: 1.0, 2: 1.0, 3: 1.0}, {**base, 9: 1.0}) == 6 / 32  # 4 won, 1 lost
    assert sign_test(base, base) == 1.0 and sign_test({0: 5.0}, {1: 5.0}) == 1.0  # no seed differs / shared
    assert sign_test({0: 200.0, 1: 180.0}, {0: 150.0, 1: 190.0}) == 0.75  # returns: won 1, lost 1


def _validation(successes: list[int]):
    """An Evaluation of 10 validation episodes (seeds 2,000,000 + i) with these successes."""
    from rlinf_cli.collectors.base import Evaluation

    per = [{"seed": 2_000_000 + i, "ret": float(s), "success_once": bool(s)} for i, s in enumerate(successes)]
    rate = sum(successes) / len(successes)
    return Evaluation({}, {}, {"eval/success_once": rate, "eval/return_mean": rate}, {"per_episode": per})


@pytest.mark.parametrize("best_p", [0.2, None])
def test_the_clone_is_given_up_only_for_a_policy_better_beyond_chance(monkeypatch, best_p):
    """From the clone's 1/10, an iteration at 2/10 (one seed more) is chance at eval.best_p=0.2 and
    the clone stays (the run says so at the end); 6/10 (five seeds more, none fewer) replaces it;
    once RL holds the lead, a higher score replaces it as before. eval.best_p=null: any higher score."""
    import contextlib
    from types import SimpleNamespace

    from omegaconf import OmegaConf

    from rlinf_cli.stages import keep

    saved: list[int] = []
    monkeypatch.setattr(keep, "save_best", lambda run, best: saved.append(best["iteration"]))
    run = SimpleNamespace(cfg=OmegaConf.create({"init": "clone", "eval": {"best_p": best_p}}), state={}, rank=0,
                          engine=SimpleNamespace(full_parameters=contextlib.nullcontext), step=lambda: 0,
                          ctx=SimpleNamespace(run_dir=Path("run")))
    clone, one_more, five_more, seven = [1] + [0] * 9, [1, 1] + [0] * 8, [1] * 6 + [0] * 4, [1] * 7 + [0] * 3
    for iteration, successes in ((0, clone), (25, one_more)):
        run.state["iteration"] = iteration
        keep.keep_best(run, lambda run, kind: _validation(successes))
    if best_p is None:
        assert saved == [0, 25]
        return
    assert saved == [0] and run.state["best"]["iteration"] == 0
    assert run.state["val_doubt"] == {"iteration": 25, "score": 0.2, "p": 0.5}
    lines = keep.notes(run)
    assert lines[0].startswith("kept: init") and "iteration 25 validated higher" in lines[1] and "p = 0.5" in lines[1]
    for iteration, successes in ((50, five_more), (75, seven)):
        run.state["iteration"] = iteration
        keep.keep_best(run, lambda run, kind: _validation(successes))
    assert saved == [0, 50, 75] and keep.notes(run)[0].startswith("kept: iteration 75")
    assert len(keep.notes(run)) == 1  # the doubt was about the clone, which is no longer kept
