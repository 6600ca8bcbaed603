"""What the text stages share: modality dispatch, text policies, evaluation, tables, JSONL data."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Sequence

from rlinf_cli.api import TEXT, TEXT_SPEC, TextTask
from rlinf_cli.errors import UserError
from rlinf_cli.registry import get_registry

_TEXT_METHODS = ("encode_prompts", "generate", "token_logprobs", "decode")


def sim_modality(node: Any) -> str:
    """``"text"`` or ``"embodied"``, from the simulator's registration (no import of the plugin)."""
    name = node.get("name") if node is not None and hasattr(node, "get") else None
    if not name:
        return "embodied"
    return str(get_registry().get("simulator", str(name)).attrs.get("modality", "embodied"))


def is_text_dataset(path: Any) -> bool:
    p = Path(str(path))
    return p.suffix in (".jsonl", ".json") and p.is_file()


def make_task(node: Any) -> TextTask:
    from rlinf_cli.stages import common

    task = common.make_simulator(node)
    if getattr(task, "modality", None) != TEXT:
        raise UserError(f"sim '{node.get('name')}' is not a text task")
    return task


def check_text_policy(policy: Any, where: str) -> Any:
    missing = [m for m in _TEXT_METHODS if not hasattr(policy, m)]
    if missing:
        name = getattr(policy, "config", {}).get("name", type(policy).__name__)
        raise UserError(f"{where}: model '{name}' is not a text model (it lacks {', '.join(missing)}); use model=hf")
    return policy


def build_policy(cfg: Any, source: str | None, device: Any) -> Any:
    """A text policy from a checkpoint (``source``) or fresh from ``cfg.model``."""
    from rlinf_cli.policy import load_policy

    if source:
        return check_text_policy(load_policy(source, device), f"checkpoint '{source}'")
    factory = get_registry().load("model", cfg.model.name)
    if get_registry().get("model", cfg.model.name).attrs.get("modality") != TEXT:
        raise UserError(f"model '{cfg.model.name}' is not a text model; text tasks need model=hf")
    return check_text_policy(factory(cfg.model, TEXT_SPEC).to(device), "model")


def max_new_tokens(node: Any, task: TextTask) -> int:
    value = node.get("max_new_tokens") if node is not None else None
    return int(value) if value else int(task.max_new_tokens)


def evaluate(policy: Any, task: TextTask, prompts: int, seed: int, new_tokens: int, pass_k: int = 0,
             batch: int = 64, generator: Any = None, on_batch: Any = None) -> tuple[dict[str, float], list[Any]]:
    """Greedy pass@1 (accuracy) on prompts ``seed .. seed+prompts-1``; sampled pass@k when ``pass_k`` > 0.

    Returns (summary, greedy completions). pass@k counts a prompt solved when any of k samples
    is correct; ``sampled_accuracy`` is the mean correctness of those samples (sampled pass@1).
    """
    from rlinf_cli.runtime.text import sample_completions

    if prompts < 1:
        return {}, []
    samples = task.prompts([seed + i for i in range(prompts)])
    greedy: list[Any] = []
    solved, sampled_correct, sampled_n = 0, 0, 0
    for start in range(0, prompts, batch):
        chunk = samples[start:start + batch]
        greedy += sample_completions(policy, task, chunk, 1, new_tokens, greedy=True)
        if pass_k > 0:
            comps = sample_completions(policy, task, chunk, pass_k, new_tokens, generator=generator)
            for g in range(len(chunk)):
                ok = [bool(c.score.correct) for c in comps[g * pass_k:(g + 1) * pass_k]]
                solved += any(ok)
                sampled_correct += sum(ok)
                sampled_n += len(ok)
        if on_batch is not None:
            on_batch(len(chunk))
    summary = {
        "prompts": float(prompts),
        "accuracy": sum(bool(c.score.correct) for c in greedy) / prompts,
        "reward_mean": sum(c.score.reward for c in greedy) / prompts,
        "completion_tokens_mean": sum(sum(c.loss_mask) for c in greedy) / prompts,
    }
    if pass_k > 0:
        summary[f"pass@{pass_k}"] = solved / prompts
        summary["sampled_accuracy"] = sampled_correct / max(sampled_n, 1)
    return summary, greedy


def summary_table(rows: dict[str, dict[str, float]], title: str) -> Any:
    from rich.table import Table

    keys = [k for k in ("accuracy", "sampled_accuracy") if any(k in s for s in rows.values())]
    keys += sorted({k for s in rows.values() for k in s if k.startswith("pass@")})
    table = Table(title=title)
    for col in ("model", "prompts", *keys, "reward", "tokens"):
        table.add_column(col, justify="left" if col == "model" else "right")
    for label, s in rows.items():
        if not s:
            table.add_row(label, *["-"] * (len(keys) + 3))
            continue
        table.add_row(label, f"{int(s['prompts'])}", *[f"{s[k]:.1%}" if k in s else "-" for k in keys],
                      f"{s['reward_mean']:.3f}", f"{s['completion_tokens_mean']:.1f}")
    return table


def examples_table(completions: Sequence[Any], n: int, title: str = "examples (greedy)") -> Any:
    from rich.table import Table

    table = Table(title=title, show_lines=False)
    for col in ("prompt", "completion", "answer", "read", "ok"):
        table.add_column(col, overflow="fold")
    for c in list(completions)[:n]:
        table.add_row(_clip(c.sample.prompt), _clip(c.text), _clip(c.sample.answer),
                      _clip(str(c.score.extracted)), "yes" if c.score.correct else "no")
    return table


def _clip(text: str, width: int = 60) -> str:
    text = text.replace("\n", "\\n")
    return text if len(text) <= width else text[: width - 3] + "..."


def examples_json(completions: Sequence[Any], n: int) -> list[dict[str, Any]]:
    return [{"prompt": c.sample.prompt, "completion": c.text, "answer": c.sample.answer,
             "extracted": c.score.extracted, "correct": bool(c.score.correct)} for c in list(completions)[:n]]


# -- JSONL prompt/completion data -------------------------------------------------------------
META_SUFFIX = ".meta.json"


def read_pairs(path: str, prompt_key: str, completion_key: str) -> list[tuple[str, str]]:
    from rlinf_cli.data.jsonl import read_rows

    rows = read_rows(path, (prompt_key, completion_key), "dataset", "set text.prompt_key / text.completion_key", strings=True)
    return [(row[prompt_key], row[completion_key]) for row in rows]


def read_meta(path: str) -> dict[str, Any]:
    """Provenance written beside a JSONL by `rlinf collect` (``<file>.meta.json``); {} if absent."""
    meta = Path(str(path) + META_SUFFIX)
    if not meta.is_file():
        return {}
    try:
        return json.loads(meta.read_text())
    except ValueError as exc:
        raise UserError(f"'{meta}' is not valid JSON ({exc}); delete or fix it") from exc
