"""Worlds: what a policy acts in, for every stage (roles.py: the roles and their settings).

:func:`make` is the one place that looks at a modality: a simulator registered with
``modality="text"`` (a text task) gets the text set of roles, any other simulator the embodied
one. :func:`settings` is the one place that reads the composed config for them.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from rlinf_cli.collectors.base import Evaluation, training_seeds
from rlinf_cli.collectors.embodied_env import transport_options
from rlinf_cli.collectors.roles import (EnvSettings, EvalSettings, PolicySettings, RecordSettings, RoleSettings,
                                        RolloutSettings, World)
from rlinf_cli.data import lerobot
from rlinf_cli.data.dataset import read_meta
from rlinf_cli.errors import UserError
from rlinf_cli.registry import get_registry
from rlinf_cli.settings import build as settings_of, plain

__all__ = ["Evaluation", "World", "check_pipeline", "make", "dataset_source", "settings", "training_seeds"]


def modality(sim_node: Any) -> str:
    """``"text"`` or ``"embodied"``, from the simulator's registration (no import of the plugin)."""
    name = sim_node.get("name") if sim_node is not None and hasattr(sim_node, "get") else None
    if not name:
        return "embodied"
    return str(get_registry().get("simulator", str(name)).attrs.get("modality", "embodied"))


def check_pipeline(sim_node: Any) -> None:
    """`rlinf pipeline` compares random, expert, clone and RL policies on episodes: embodied only."""
    if modality(sim_node) == "text":
        raise UserError(f"`rlinf pipeline` runs embodied simulators; for the text task '{sim_node.get('name')}' run "
                        "collect, sft, rl and eval (see docs/llm.md)")


def settings(cfg: Any, device: Any) -> RoleSettings:
    """Each role's settings from the composed config (keys a stage lacks take their defaults)."""
    get = cfg.get
    text = get("text") or {}
    env, lerobot, executor = get("env"), get("lerobot"), get("executor")
    new_tokens = text.get("max_new_tokens") or None
    seed, num_envs = int(get("seed", 0)), int(get("num_envs", 8))
    return RoleSettings(
        policy=PolicySettings(device=device, init=get("init"), resume=get("resume"),
                              init_action_std=get("init_action_std"), learn_action_std=get("learn_action_std"),
                              threads=(get("train") or {}).get("threads", "auto")),
        env=EnvSettings(executor=plain(executor) if executor is not None else None,
                        runtime=transport_options(get("runtime"), env), device=device),
        rollout=RolloutSettings(seed=seed, num_envs=num_envs, total_steps=_int(get("total_steps")),
                                iterations=_int(text.get("iterations")), max_new_tokens=new_tokens,
                                init=get("init"), demos=get("demos"), normalize=plain(env) if env is not None else None,
                                overlap_update=bool((get("runtime") or {}).get("overlap_update", False)),
                                progress=bool(get("progress", True)), generation=_generation(cfg),
                                max_staleness=int((get("runtime") or {}).get("max_staleness", 0) or 0)),
        eval=EvalSettings(num_envs=num_envs, max_new_tokens=new_tokens),
        record=RecordSettings(seed=seed, num_envs=num_envs, deterministic=bool(get("deterministic", True)),
                              action_noise=float(get("action_noise", 0.0)), epsilon=float(get("epsilon", 0.0)),
                              format=str(get("format", "rlinf")), lerobot=plain(lerobot) if lerobot is not None else None,
                              sim_name=(get("sim") or {}).get("name"), samples=int(text.get("samples", 1)),
                              max_new_tokens=new_tokens, text=get("text")),
    )


def _generation(cfg: Any) -> Any:
    """``placement.generation`` (rl's config), or None where the stage has none."""
    from rlinf_cli.runtime.generation import GenerationPlacement

    node = (cfg.get("placement") or {}).get("generation")
    return None if node is None else settings_of(GenerationPlacement, node, "placement.generation")


def _int(value: Any) -> int | None:
    return None if value is None else int(value)


def make(cfg: Any, ctx: Any, sim_node: Any = None, text: bool | None = None) -> World:
    """The :class:`~rlinf_cli.collectors.roles.World` for ``sim_node`` (default: ``cfg.sim``);
    ``text`` forces the text one (a JSONL dataset without a known task)."""
    node = sim_node if sim_node is not None else cfg.get("sim")
    s = settings(cfg, ctx.device)
    from rlinf_cli.collectors.world import embodied_world, text_world  # torch: off the --help path

    if text if text is not None else modality(node) == "text":
        return text_world(node, s, ctx)
    return embodied_world(node, s, ctx)


def dataset_source(path: str) -> tuple[bool, dict[str, Any] | None, str | None]:
    """What `sft` learns from: (is text, the simulator that made it, its config choice), from the
    dataset's own provenance: a JSONL file of prompt/completion pairs, or an rlinf dataset."""
    p = Path(str(path))
    if p.suffix in (".jsonl", ".json") and p.is_file():
        from rlinf_cli.collectors.text_record import provenance_sim  # torch: only for a text dataset

        return (True, *provenance_sim(str(p)))
    if lerobot.is_lerobot_dataset(p):  # rlinf's own LeRobot datasets keep their provenance beside LeRobot's files
        meta = p / lerobot.RLINF_META
        prov = (json.loads(meta.read_text()).get("provenance") or [{}])[-1] if meta.is_file() else {}
    else:
        prov = (read_meta(p).get("provenance") or [{}])[-1]
    sim = prov.get("sim")
    return False, sim, prov.get("sim_choice", (sim or {}).get("name"))
