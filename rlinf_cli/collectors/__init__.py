"""Collectors: the world a policy acts in, for every stage (see base.py for the protocol).

:func:`make` is the one place that looks at a modality: a simulator registered with
``modality="text"`` (a text task) gets the text collector, any other simulator the embodied one.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from rlinf_cli.collectors.base import Evaluation, training_seeds

__all__ = ["Evaluation", "check_pipeline", "make", "dataset_source", "training_seeds"]


def modality(sim_node: Any) -> str:
    """``"text"`` or ``"embodied"``, from the simulator's registration (no import of the plugin)."""
    from rlinf_cli.registry import get_registry

    name = sim_node.get("name") if sim_node is not None and hasattr(sim_node, "get") else None
    if not name:
        return "embodied"
    return str(get_registry().get("simulator", str(name)).attrs.get("modality", "embodied"))


def check_pipeline(sim_node: Any) -> None:
    """`rlinf pipeline` compares random, expert, clone and RL policies on episodes: embodied only."""
    if modality(sim_node) == "text":
        from rlinf_cli.errors import UserError

        raise UserError(f"`rlinf pipeline` runs embodied simulators; for the text task '{sim_node.get('name')}' run "
                        "collect, sft, rl and eval (see docs/llm.md)")


def make(cfg: Any, ctx: Any, sim_node: Any = None, text: bool | None = None) -> Any:
    """The collector for ``sim_node`` (default: ``cfg.sim``); ``text`` forces the text one (a
    JSONL dataset without a known task)."""
    node = sim_node if sim_node is not None else cfg.get("sim")
    if text if text is not None else modality(node) == "text":
        from rlinf_cli.collectors.text import TextCollector

        return TextCollector(cfg, ctx, node)
    from rlinf_cli.collectors.embodied import EmbodiedCollector

    return EmbodiedCollector(cfg, ctx, node)


def dataset_source(path: str) -> tuple[bool, dict[str, Any] | None, str | None]:
    """What `sft` learns from: (is text, the simulator that made it, its config choice), from the
    dataset's own provenance: a JSONL file of prompt/completion pairs, or an rlinf dataset."""
    p = Path(str(path))
    if p.suffix in (".jsonl", ".json") and p.is_file():
        from rlinf_cli.collectors.text import provenance_sim

        return (True, *provenance_sim(str(p)))
    from rlinf_cli.data import lerobot
    from rlinf_cli.data.dataset import read_meta

    if lerobot.is_lerobot_dataset(p):  # rlinf's own LeRobot datasets keep their provenance beside LeRobot's files
        meta = p / lerobot.RLINF_META
        prov = (json.loads(meta.read_text()).get("provenance") or [{}])[-1] if meta.is_file() else {}
    else:
        prov = (read_meta(p).get("provenance") or [{}])[-1]
    sim = prov.get("sim")
    return False, sim, prov.get("sim_choice", (sim or {}).get("name"))
