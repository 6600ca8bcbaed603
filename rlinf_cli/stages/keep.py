"""Which policy an `rl` run hands on: the best on validation seeds (``eval.best``, on by default).

RL returns wander, and a run started from a good clone can end below it. With ``eval.best`` the
run validates its policy on seeds of its own (``eval.val_seed + i``: apart from the training
seeds, below 1,000,000, and from the final evaluation's, ``eval.seed + i``) before the first
update, every ``eval.interval`` iterations and after the last one, and keeps the highest-scoring
policy as ``checkpoints/best``, the starting policy (the clone of ``init=``) included. That is the
policy ``result.json`` names as ``kept`` and the pipeline's next stage and final evaluation use;
``eval.best=false`` keeps the last one. The clone is given up only for a policy that beats it on
the same validation seeds beyond chance (``eval.best_p``, a sign test: :func:`beats`). Choosing
on seeds the final evaluation does not use keeps that evaluation an unbiased estimate of the kept
policy.
"""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path
from typing import Any, Callable

# What a validation is scored by, the first present: success with every task weighing the same
# (multi-task simulators), success, accuracy (text tasks), return.
SCORE_KEYS = ("task_mean/success_once", "success_once", "accuracy", "return_mean")
BEST_FILE = "best.json"  # in checkpoints/best: which validation it won (resume checks it is the run's)


def score(metrics: dict[str, float], prefix: str) -> tuple[str, float] | None:
    """(metric, value) a validation is ranked by, or None if it measured none of SCORE_KEYS."""
    for key in SCORE_KEYS:
        if prefix + key in metrics:
            return key, float(metrics[prefix + key])
    return None


def beats(value: float, best: dict[str, Any] | None, from_init: bool,
          outcomes: dict[int, float] | None = None, max_p: float | None = None) -> bool:
    """Whether a validation scoring ``value`` replaces the best so far: a higher score does; a tie
    does too (the more trained policy), except a tie with the clone an ``init=`` run started from.
    RL has to beat the clone on validation before the clone is given up: a tie at a saturated
    validation (10 of 10 successes for both) says nothing about which is better, and the clone is
    the policy the user already had (MT10, button-press-topdown: a tie kept PPO's iteration 98, which
    then scored 98% on the held-out seeds against the clone's 100%).

    With ``max_p`` (``eval.best_p``) and the episodes' ``outcomes`` of both, the clone is given up
    only for a policy that beats it beyond chance on the same validation seeds (:func:`sign_test`
    p <= max_p): one more success in ten is not evidence (MT10 grasping tasks: RL iterations that
    validated 2/10 against the clone's 1/10 scored 6-14% on the held-out seeds against 18-20%)."""
    if best is None:
        return True
    if from_init and best["iteration"] == 0 and max_p is not None and outcomes and best.get("outcomes"):
        # and a higher score: with returns, wins on more seeds could still mean a lower mean
        return value > best["score"] and sign_test(outcomes, {int(k): v for k, v in best["outcomes"]}) <= max_p
    if value > best["score"]:
        return True
    return value == best["score"] and not (from_init and best["iteration"] == 0)


def sign_test(candidate: dict[int, float], base: dict[int, float]) -> float:
    """One-sided p-value that ``candidate`` is no better than ``base`` on the seeds both ran (seed ->
    the episode's score): under that hypothesis each seed where they differ is a coin flip, so p =
    P(Binomial(differing, 1/2) >= seeds the candidate won). 1.0 when they differ nowhere."""
    pairs = [(candidate[s], base[s]) for s in candidate.keys() & base.keys()]
    wins, losses = sum(c > b for c, b in pairs), sum(c < b for c, b in pairs)
    n = wins + losses
    if n == 0:
        return 1.0
    return sum(math.comb(n, k) for k in range(wins, n + 1)) / 2.0 ** n


def episode_outcomes(ev: Any, metric: str) -> dict[int, float] | None:
    """Seed -> one validation episode's share of ``metric`` (its success, or its return), or None
    where the evaluator reports no episodes (text tasks)."""
    eps = (getattr(ev, "extra", None) or {}).get("per_episode")
    if not eps or any(e.get("seed") is None for e in eps):
        return None
    field = "ret" if metric == "return_mean" else "success_once"
    return {int(e["seed"]): float(e[field]) for e in eps}


def keep_best(run: Any, evaluate: Callable[..., Any]) -> dict[str, float]:
    """Validate the current policy and keep it as checkpoints/best when it :func:`beats` every
    validation before. Records the first
    validation (``val_start``, the starting policy) and the latest (``val_last``) in the run's
    state, which checkpoints keep. Every rank calls it (ZeRO-3 gathers the weights for rank 0 to
    evaluate, and every rank follows rank 0's decision)."""
    from rlinf_cli.runtime.dist import broadcast_from_first

    state = run.state
    metrics: dict[str, float] = {}
    from_init, max_p = bool(run.cfg.init), run.cfg.eval.get("best_p")
    with run.engine.full_parameters():
        ev = None
        if run.rank == 0:
            ev = evaluate(run, kind="validation")
            metrics = {"val/" + k.split("/", 1)[1]: v for k, v in ev.metrics.items()}
        scored, best, new, seen, doubt = score(metrics, "val/"), state.get("best"), None, None, None
        if scored is not None:
            seen = {"metric": scored[0], "score": scored[1], "iteration": state["iteration"], "step": run.step()}
            outcomes = episode_outcomes(ev, scored[0]) if max_p is not None and from_init else None
            if outcomes is not None and state["iteration"] == 0:  # the clone's, for the test (JSON: pairs)
                seen["outcomes"] = [[k, v] for k, v in sorted(outcomes.items())]
            if beats(scored[1], best, from_init, outcomes, max_p):
                new = seen
            elif best is not None and best["iteration"] == 0 and scored[1] > best["score"]:
                # scored higher than the clone, not beyond chance: said at the end of the run
                doubt = {"iteration": state["iteration"], "score": scored[1],
                         "p": sign_test(outcomes or {}, {int(k): v for k, v in best.get("outcomes", [])})}
        new, seen, doubt = broadcast_from_first((new, seen, doubt))
        if seen is not None:
            state["val_last"] = seen
            if state["iteration"] == 0:
                state["val_start"] = seen
        if doubt is not None and doubt["score"] > (state.get("val_doubt") or {}).get("score", -math.inf):
            state["val_doubt"] = doubt
        if new is not None:
            state["best"] = new
            save_best(run, new)
    return metrics


def save_best(run: Any, best: dict[str, Any]) -> None:
    from rlinf_cli import checkpoint as ckpt

    def write(tmp: Path) -> None:
        run.world.rollout.save_files(tmp)  # normalization statistics: the policy expects them
        (tmp / BEST_FILE).write_text(json.dumps(best))

    ckpt.save(run.ctx.run_dir / "checkpoints" / "best", run.policy, run.cfg_yaml, rank=run.rank, write_files=write)


def restore_best(run: Any, resume_dir: Path) -> None:
    """A resumed run's best-so-far (in its state) needs its weights in this run's checkpoints/best:
    the source run's best if it is still that validation's (the source may have gone on to a
    better one after the checkpoint resumed from), else the periodic checkpoint of that iteration.
    Neither there: validations start over, said in one line."""
    from rlinf_cli.checkpoint import commit_dir
    from rlinf_cli.runtime.dist import broadcast_from_first

    best, dest = run.state["best"], run.ctx.run_dir / "checkpoints" / "best"
    found = None
    if run.rank == 0:
        kept, periodic = resume_dir.parent / "best", resume_dir.parent / f"iter_{best['iteration']:06d}"
        won = kept / BEST_FILE
        if (kept / "config.json").is_file() and won.is_file() and json.loads(won.read_text()) == best:
            found = kept
        elif (periodic / "config.json").is_file():
            found = periodic
        if found is not None and found.resolve() != dest.resolve():
            tmp = dest.with_name(f".{dest.name}.tmp")
            shutil.rmtree(tmp, ignore_errors=True)
            shutil.copytree(found, tmp)
            (tmp / BEST_FILE).write_text(json.dumps(best))
            commit_dir(tmp, dest)
    if not broadcast_from_first(found is not None):
        run.ctx.note(f"the best policy so far (iteration {best['iteration']}) is in neither {resume_dir.parent / 'best'} "
                     f"nor a checkpoint of that iteration; eval.best starts choosing again")
        del run.state["best"]


def kept_label(best: dict[str, Any] | None, from_init: bool) -> str:
    """What the run hands on, in the words of the tables: ``init`` (the starting checkpoint won),
    ``iteration N``, or ``last`` (eval.best=false)."""
    if best is None:
        return "last"
    return "init" if best["iteration"] == 0 and from_init else f"iteration {best['iteration']}"


def decline(state: dict[str, Any]) -> str | None:
    """The one line saying that the last policy scored below the starting one on validation, or None."""
    start, last = state.get("val_start"), state.get("val_last")
    if start is None or last is None or last["iteration"] == start["iteration"] or last["score"] >= start["score"]:
        return None
    return (f"warning: RL ended below its start on validation ({last['metric']} {last['score']:.3g} < "
            f"{start['score']:.3g})")


def report(run: Any, evaluate: Callable[..., Any], final: Any, result: dict[str, Any],
           rows: dict[str, Any]) -> dict[str, float]:
    """The kept policy in ``result.json`` (``kept``, ``below_start``, ``best``) and as a row of the
    final table: evaluated on the same held-out seeds as the last policy (``final``, reused when the
    last is the kept one). Returns its metrics for tracking (``eval_best/``)."""
    best, state = run.state.get("best"), run.state
    label = kept_label(best, bool(run.cfg.init))
    result["kept"] = label
    result["below_start"] = decline(state) is not None
    if best is None:
        return {}
    result["best"] = {**best, "checkpoint": str(run.ctx.run_dir / "checkpoints" / "best")}
    if final is None or not final.summary:  # eval.episodes=0 (or not rank 0): no table to add a row to
        return {}
    # the last policy is the kept one: the same weights, the same numbers
    ev = final if best["iteration"] == state["iteration"] else evaluate(run, kind="best")
    result["best"]["eval"] = ev.summary
    rows[f"{run.cfg.algo.name} kept: {label}"] = ev.summary
    return {k.replace("eval/", "eval_best/", 1): v for k, v in ev.metrics.items()}


def notes(run: Any) -> list[str]:
    """The lines ``rl`` ends with about the kept policy: which one and where, and a decline."""
    best = run.state.get("best")
    if best is None:
        return []
    out = [f"kept: {kept_label(best, bool(run.cfg.init))} (validation {best['metric']} {best['score']:.3g}): "
           f"{run.ctx.run_dir / 'checkpoints' / 'best'}"]
    doubt = run.state.get("val_doubt")
    if doubt is not None and best["iteration"] == 0:
        out.append(f"iteration {doubt['iteration']} validated higher ({best['metric']} {doubt['score']:.3g}) but not "
                   f"beyond chance on the same seeds (sign test p = {doubt['p']:.2g} > eval.best_p = "
                   f"{run.cfg.eval.get('best_p')}); more validation episodes (eval.val_episodes) can tell them apart")
    line = decline(run.state)
    return out + ([f"{line}; kept: {kept_label(best, bool(run.cfg.init))}"] if line else [])
