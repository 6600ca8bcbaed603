"""Checks of a composed stage config before anything runs: one line per mistake, exit code 2.

Types are checked when overrides are parsed (rlinf_cli/config.py); here: required settings that
were not given, and values out of their range (``num_envs=0``, ``total_steps=-5``), so a bad
run stops in the first second instead of after minutes, and writes nothing.
"""

from __future__ import annotations

import math
from typing import Any, Callable

from rlinf_cli.errors import UserError

# (key, test, what the value must be). A key absent from the stage's config is skipped.
Rule = tuple[str, Callable[[Any], bool], str]


def _at_least(n: float) -> Callable[[Any], bool]:
    return lambda v: isinstance(v, (int, float)) and not isinstance(v, bool) and v >= n


def _fraction(upper_open: bool = False) -> Callable[[Any], bool]:
    return lambda v: isinstance(v, (int, float)) and 0 <= v and (v < 1 if upper_open else v <= 1)


_POSITIVE = (_at_least(1), "an integer >= 1")
_NON_NEGATIVE = (_at_least(0), "a number >= 0")

COMMON: list[Rule] = [
    ("train.threads", *_POSITIVE),
    ("runtime.env_workers", *_NON_NEGATIVE),
    ("runtime.max_restarts", *_NON_NEGATIVE),
    ("runtime.worker_timeout_s", lambda v: isinstance(v, (int, float)) and v > 0, "a number of seconds > 0"),
    ("tracking.flush_s", *_NON_NEGATIVE),
    # bool or the word: `train.bf16=true` arrives as a bool, `train.bf16=auto` as a string; null is
    # auto, as the engine reads it (runtime/engine.py: bf16_setting)
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
        ("text.iterations", *_POSITIVE),
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


def validation_episodes(cfg: Any) -> int:
    """Episodes per validation of ``eval.best``: ``eval.val_episodes``, or ``eval.episodes``."""
    n = cfg.eval.get("val_episodes")
    return int(cfg.eval.episodes if n is None else n)


def check_best(cfg: Any) -> None:
    """``eval.best`` needs evaluations during training to choose from; said before anything runs."""
    if not cfg.eval.get("best"):
        return
    if not int(cfg.eval.interval):
        raise UserError("eval.best=true keeps the best policy of the evaluations during training: set "
                        "eval.interval=N (iterations between them)")
    if validation_episodes(cfg) < 1:
        raise UserError("eval.best=true needs validation episodes: set eval.val_episodes=N (or eval.episodes=N)")


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
            raise UserError(f"bad value for '{key}': {value!r}; it must be {what}")
    if stage == "rl":
        check_best(cfg)
