"""Task recommendations: the settings a simulator plugin ships for one of its tasks and an
algorithm (rl-zoo's idea), used where the user sets nothing.

A simulator plugin puts ``conf/recommended/<simulator name>.yaml`` beside its ``conf/sim/``::

    task_key: env_id          # the sim key that names the task (sim.env_id)
    scratch:                  # `rlinf rl` from scratch (no init=, no resume=)
      CartPole-v1:
        ppo:                  # the algorithm's registered name
          num_envs: 8         # keys relative to the stage config, as a user would write them
          algo.lr: 1.0e-3
    init:                     # `rlinf rl init=<checkpoint>`: fine-tuning a policy from sft or rl
      "*":                    # any task of this simulator (a task's own entry wins over it)
        ppo: {...}
      "peg-*":                # a task family (an fnmatch glob): wins over "*", loses to the task's own
        ppo: {...}

Precedence, lowest first: the YAML defaults, the task's recommendation, values inherited from a
checkpoint (``init=``/``resume=``), the user's overrides. A resumed run repeats its saved config
whole, so no recommendation applies to it. Keys the composed config lacks (a recommendation for
``model.hidden_sizes`` when the model has no such key) are skipped. The keys that were applied are
recorded in the config as ``recommended`` (saved with the run, shown by ``rlinf config show``).
"""

from __future__ import annotations

import fnmatch
from pathlib import Path
from typing import Any, Iterable

from rlinf_cli.errors import UserError

STAGES = ("rl",)  # stages whose settings depend on the task and the algorithm
DIRNAME = "recommended"  # conf/<DIRNAME>/<simulator>.yaml: values for existing keys, not config options of their own
WILDCARD = "*"


def recommendation_file(sim_name: str, dirs: Iterable[Path]) -> Path | None:
    for d in dirs:
        path = d / DIRNAME / f"{sim_name}.yaml"
        if path.is_file():
            return path
    return None


def lookup(cfg: Any, dirs: Iterable[Path]) -> tuple[dict[str, Any], str | None]:
    """The recommended ``{key: value}`` for this composed config's simulator, task, algorithm and
    start (scratch or init), and a label naming where they come from; ``({}, None)`` if none."""
    from omegaconf import OmegaConf

    if cfg.get("stage") not in STAGES or cfg.get("resume"):
        return {}, None
    sim = cfg.get("sim")
    algo = cfg.get("algo")
    if sim is None or algo is None or not sim.get("name") or not algo.get("name"):
        return {}, None
    path = recommendation_file(str(sim.name), dirs)
    if path is None:
        return {}, None
    try:
        table = OmegaConf.to_container(OmegaConf.load(path), resolve=True)
    except Exception as exc:
        raise UserError(f"'{path}' is not valid YAML ({str(exc).splitlines()[0]}); reinstall the simulator plugin") from exc
    if not isinstance(table, dict):
        return {}, None
    task = sim.get(str(table.get("task_key", "env_id")))
    start = "init" if cfg.get("init") else "scratch"
    section = table.get(start) or {}
    merged: dict[str, Any] = {}
    for entry in applicable(section, str(task)):
        values = (entry or {}).get(str(algo.name)) if isinstance(entry, dict) else None
        if isinstance(values, dict):
            merged.update(values)
    if not merged:
        return {}, None
    return merged, f"{sim.name} {task}, {algo.name}{' from a checkpoint' if start == 'init' else ''}"


def applicable(section: dict[str, Any], task: str) -> list[Any]:
    """The entries of ``section`` that apply to ``task``, least specific first (later ones win):
    ``"*"``, then task-family patterns (``"peg-*"``, ``"drawer-*-v3"``: fnmatch globs) from the
    fewest literal characters to the most, then the task's own entry."""
    families = [k for k in section if k not in (WILDCARD, task) and any(c in k for c in "*?[")
                and fnmatch.fnmatchcase(task, k)]
    families.sort(key=lambda k: len(k) - sum(k.count(c) for c in "*?[]"))
    return [section.get(WILDCARD), *(section[k] for k in families), section.get(task)]


def override_text(key: str, value: Any) -> str:
    """``key=value`` as Hydra parses it back to the same value (JSON for lists, mappings, strings)."""
    import json

    return f"{key}={repr(value) if isinstance(value, float) else json.dumps(value)}"
