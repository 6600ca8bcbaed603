"""Checks of a composed stage config before anything runs: one line per mistake, exit code 2.

Types are checked when overrides are parsed (rlinf_cli/config.py); here: required settings that
were not given, and values out of their range (``num_envs=0``, ``total_steps=-5``), so a bad
run stops in the first second instead of after minutes, and writes nothing. Rules that hold
for every key of a kind, whatever plugin it belongs to: numbers are finite, seeds fit the
seeding of every library, paths fit the file system.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Iterator

from rlinf_cli.errors import UserError, shown
from rlinf_cli.runtime.generation import SYNC_MODES

# Seeds go to Python's, numpy's and torch's generators and to simulators: numpy's legacy seeding
# (which simulators use) takes 0 <= seed < 2**32, the narrowest of them.
SEED_LIMIT = 2**32
# Settings that name files or directories (checked against the file system's limits on names).
PATH_KEYS = ("output", "dataset", "run_dir", "runs_dir", "checkpoint", "init", "resume", "demos", "policy")
NAME_MAX, PATH_MAX = 255, 4096  # bytes: Linux's limits for one name in a path, and for a whole path
# MLflow's limits (its database columns; the embedded sqlite store would take more, a server would not)
RUN_NAME_MAX, EXPERIMENT_NAME_MAX = 250, 500

# (key, test, what the value must be). A key absent from the stage's config is skipped.
Rule = tuple[str, Callable[[Any], bool], str]


def _at_least(n: float) -> Callable[[Any], bool]:
    return lambda v: isinstance(v, (int, float)) and not isinstance(v, bool) and v >= n


def _fraction(upper_open: bool = False) -> Callable[[Any], bool]:
    return lambda v: isinstance(v, (int, float)) and 0 <= v and (v < 1 if upper_open else v <= 1)


_POSITIVE = (_at_least(1), "an integer >= 1")
_NON_NEGATIVE = (_at_least(0), "a number >= 0")

COMMON: list[Rule] = [
    ("train.threads", lambda v: str(v).strip().lower() == "auto" or _at_least(1)(v), "auto or an integer >= 1"),
    ("runtime.env_workers", *_NON_NEGATIVE),
    ("runtime.max_restarts", *_NON_NEGATIVE),
    ("runtime.worker_timeout_s", lambda v: isinstance(v, (int, float)) and v > 0, "a number of seconds > 0"),
    ("tracking.flush_s", *_NON_NEGATIVE),
    # bool or the word: `train.bf16=true` arrives as a bool, `train.bf16=auto` as a string; null is
    # auto, as the engine reads it (runtime/precision.py: bf16_setting)
    ("train.bf16", lambda v: v is None or isinstance(v, bool) or str(v).strip().lower() in ("auto", "true", "false"),
     "auto, true or false"),
]
STAGE_RULES: dict[str, list[Rule]] = {
    "rl": [
        ("total_steps", *_POSITIVE),
        ("num_envs", *_POSITIVE),
        ("checkpoint.interval", *_POSITIVE),
        ("checkpoint.keep", *_POSITIVE),
        ("eval.episodes", *_NON_NEGATIVE),
        ("eval.interval", *_NON_NEGATIVE),
        ("eval.val_episodes", *_POSITIVE),
        ("eval.best_p", lambda v: v is None or (_fraction()(v) and v > 0), "a p-value in (0, 1], or null"),
        ("text.iterations", *_POSITIVE),
        ("placement.generation.workers", _at_least(0), "an integer >= 0"),
        ("placement.generation.sync", lambda v: str(v) in SYNC_MODES, "one of " + ", ".join(SYNC_MODES)),
        ("runtime.max_staleness", _at_least(0), "an integer >= 0"),
    ],
    "collect": [
        ("episodes", *_POSITIVE),
        ("num_envs", *_POSITIVE),
        ("chunk_episodes", *_POSITIVE),
        ("action_noise", *_NON_NEGATIVE),
        ("epsilon", _fraction(), "a probability in [0, 1]"),
        ("text.samples", *_POSITIVE),
    ],
    "sft": [
        ("val_fraction", _fraction(upper_open=True), "a fraction in [0, 1)"),
        ("eval.episodes", *_NON_NEGATIVE),
        ("text.max_length", *_POSITIVE),
    ],
    "eval": [
        ("episodes", *_POSITIVE),
        ("num_envs", *_POSITIVE),
        ("text.pass_k", *_NON_NEGATIVE),
        ("text.batch", *_POSITIVE),
    ],
}

# what to write for a required setting (`???` in the stage YAML)
REQUIRED_HINT = {
    "output": "the dataset directory to write, e.g. output=data/mytask",
    "dataset": "a dataset directory written by `rlinf collect`, e.g. dataset=data/mytask",
    "checkpoint": "a checkpoint directory (or checkpoint=random), e.g. checkpoint=rlinf_runs/rl/<run>/checkpoints/final",
}


# Training episodes' seeds stay below this (runtime/vector.py TRAIN_SEED_SPACE, collectors/base.py
# training_seeds; tests/unit/test_keep_seeds.py holds them equal): validation seeds start above it.
TRAIN_SEEDS = 1_000_000
# Text tasks (rlinf-sim-reasoning's tasks.py) draw held-out prompts for seeds in [1,000,000, 2,000,000)
# and training-split prompts again from 2,000,000: eval.best's validation seeds on a text task.
TEXT_VALIDATION_SEEDS = 2_000_000


def validation_episodes(cfg: Any, text: bool = False) -> int:
    """Episodes per validation of ``eval.best``: ``eval.val_episodes`` (on a text task
    ``text.val_episodes``), or ``eval.episodes`` where that is null. A text episode is one prompt:
    the few episodes that suffice to tell a simulator's policies apart cannot rank language models."""
    n = (cfg.get("text") or {}).get("val_episodes") if text else cfg.eval.get("val_episodes")
    return int(cfg.eval.episodes if n is None else n)


def _text_task(cfg: Any) -> bool:
    from rlinf_cli.collectors import modality

    try:
        return modality(cfg.get("sim")) == "text"
    except UserError:  # an unknown simulator: said where plugins are resolved
        return False


def seed_range(first: int, n: int) -> str:
    return f"{first:,}..{first + n - 1:,}"


def check_best(cfg: Any, final: tuple[int, int] | None = None) -> None:
    """``eval.best``: validation episodes to choose with, on seeds apart from the training seeds
    and from the final evaluation's (``final`` = (seed, episodes) of an evaluation run elsewhere,
    the pipeline's eval step; else ``eval.seed``, ``eval.episodes``). Said before anything runs."""
    if not cfg.eval.get("best"):
        return
    text = _text_task(cfg)
    n, first = validation_episodes(cfg, text), int(cfg.eval.val_seed)
    if n < 1:
        key = "text.val_episodes" if text else "eval.val_episodes"
        raise UserError(f"eval.best=true needs validation episodes: set {key}=N (or eval.episodes=N)")
    if first < TRAIN_SEEDS:
        raise UserError(f"eval.val_seed={first}: validation seeds {seed_range(first, n)} would be training seeds "
                        f"(those are below {TRAIN_SEEDS:,}); set eval.val_seed >= {TRAIN_SEEDS}")
    if text and first < TEXT_VALIDATION_SEEDS:
        raise UserError(f"eval.val_seed={first}: on a text task validation seeds start at {TEXT_VALIDATION_SEEDS:,} "
                        f"(they draw training-split prompts; seeds below it draw the held-out prompts the final "
                        f"evaluation scores): set eval.val_seed >= {TEXT_VALIDATION_SEEDS}")
    seed, episodes = final or (int(cfg.eval.seed), int(cfg.eval.episodes))
    if episodes and first < seed + episodes and seed < first + n:
        raise UserError(f"validation seeds {seed_range(first, n)} (eval.val_seed, eval.val_episodes) overlap the final "
                        f"evaluation's {seed_range(seed, episodes)}: set eval.val_seed={max(seed + episodes, TRAIN_SEEDS)} "
                        f"or above (or eval.best=false to keep the last policy)")


def validate(stage: str, cfg: Any) -> None:
    """Raise :class:`UserError` for the first required setting missing or value out of range."""
    from omegaconf import OmegaConf

    missing = sorted(OmegaConf.missing_keys(cfg))
    if missing:
        key = missing[0]
        hint = REQUIRED_HINT.get(key, f"{key}=<value>")
        raise UserError(f"`rlinf {stage}` needs the setting '{key}': pass {hint}")
    for key, ok, what in COMMON + STAGE_RULES.get(stage, []):
        value = OmegaConf.select(cfg, key, default=None)
        if value is None:
            continue
        if isinstance(value, float) and math.isnan(value) or not ok(value):
            raise UserError(f"bad value for '{key}': {shown(value)}; it must be {what}")
    for key, value in _leaves(OmegaConf.to_container(cfg, resolve=True)):
        _check_leaf(key, value)
    for key in PATH_KEYS:
        value = OmegaConf.select(cfg, key, default=None)
        if isinstance(value, str):
            check_path(key, value)
    _check_tracking(cfg)
    if stage == "rl":
        check_best(cfg)
        check_budget(cfg)
        check_generation(cfg)


def _leaves(node: Any, prefix: str = "") -> Iterator[tuple[str, Any]]:
    if isinstance(node, dict):
        for k, v in node.items():
            yield from _leaves(v, f"{prefix}{k}.")
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from _leaves(v, f"{prefix[:-1]}[{i}].")
    else:
        yield prefix[:-1], node


def _check_leaf(key: str, value: Any) -> None:
    """Rules for every key: no NaN or infinity anywhere (every rate, coefficient and limit is a
    finite number; a setting that can be off is off with null), and seeds in ``[0, 2**32)``."""
    if isinstance(value, float) and not math.isfinite(value):
        raise UserError(f"bad value for '{key}': {value}; settings take finite numbers "
                        f"(null turns off a setting that can be off)")
    name = key.rsplit(".", 1)[-1]
    if (name == "seed" or name.endswith("_seed")) and value is not None:
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < SEED_LIMIT:
            raise UserError(f"bad value for '{key}': {shown(value)}; a seed is an integer from 0 to "
                            f"{SEED_LIMIT - 1:,} (2**32 - 1)")


def check_path(key: str, value: str) -> None:
    """A path the file system can hold: every name in it at most NAME_MAX bytes, the whole at
    most PATH_MAX (else writing fails late with 'File name too long')."""
    import os

    raw = os.fsencode(value)
    longest = max((len(part) for part in raw.split(b"/")), default=0)
    if longest > NAME_MAX or len(raw) > PATH_MAX:
        what = f"a name in it is {longest:,} bytes long (at most {NAME_MAX})" if longest > NAME_MAX \
            else f"it is {len(raw):,} bytes long (at most {PATH_MAX})"
        raise UserError(f"bad value for '{key}': {shown(value)} cannot be a path: {what}; choose a shorter one")


def _check_tracking(cfg: Any) -> None:
    tracking = cfg.get("tracking") or {}
    for key, limit in (("run_name", RUN_NAME_MAX), ("experiment", EXPERIMENT_NAME_MAX)):
        value = tracking.get(key)
        if value is not None and len(str(value)) > limit:
            raise UserError(f"bad value for 'tracking.{key}': {shown(value)} is {len(str(value)):,} characters "
                            f"long; MLflow takes at most {limit}")


def check_generation(cfg: Any) -> None:
    """Generation workers sample a language model's rollouts: a text task's, with weights every worker
    can be given (not ZeRO-3's partitions); ``runtime.max_staleness`` is theirs to honour."""
    workers = int(((cfg.get("placement") or {}).get("generation") or {}).get("workers") or 0)
    staleness = int((cfg.get("runtime") or {}).get("max_staleness") or 0)
    if staleness and not workers:
        raise UserError(f"runtime.max_staleness={staleness} lets generation workers sample during the update; there "
                        f"are none: set placement.generation.workers=N (text tasks), or runtime.max_staleness=0")
    if not workers:
        return
    if not _text_task(cfg):
        raise UserError(f"placement.generation.workers={workers} runs a language model's sampling in generation "
                        f"workers: it needs a text task (sim=arithmetic, jsonl, ...), and sim={cfg.sim.name} is not "
                        f"one; for a simulator's envs use runtime.mode=disaggregated (runtime.env_workers)")
    train = cfg.get("train") or {}
    if str(train.get("backend")) == "deepspeed" and int(train.get("zero_stage") or 0) == 3:
        raise UserError("placement.generation.workers needs every weight on each rank to send to its workers; "
                        "train.zero_stage=3 partitions them: use zero_stage 0-2, or placement.generation.workers=0")


def check_budget(cfg: Any) -> None:
    """More envs than ``total_steps``: one rollout steps every env at least once, so not even
    one iteration fits the budget, and making the envs alone can take minutes."""
    num_envs, total = cfg.get("num_envs"), cfg.get("total_steps")
    if isinstance(num_envs, int) and isinstance(total, int) and num_envs > total:
        raise UserError(f"num_envs={num_envs:,} is more envs than total_steps={total:,} has steps: an iteration "
                        f"steps every env at least once, so not even one fits; lower num_envs or raise total_steps")
