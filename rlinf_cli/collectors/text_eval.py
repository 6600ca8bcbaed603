"""The text evaluator: greedy pass@1 (and sampled pass@k) of a language model on a task's held-out
prompts, with tables of the results and of example completions."""

from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np
import torch
from rich.table import Table

from rlinf_cli.api import TextTask
from rlinf_cli.collectors.base import Evaluation
from rlinf_cli.collectors.roles import EvalSettings
from rlinf_cli.collectors.text_sampling import Completion, accuracy, episode_metrics, sample_completions
from rlinf_cli.collectors.text_tools import NO_TOOLS, Toolbox
from rlinf_cli.errors import UserError


def summary_table(rows: dict[str, dict[str, float]], title: str) -> Any:
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
                      f"{s['reward_mean']:.3f}" if "reward_mean" in s else "-",
                      f"{s['completion_tokens_mean']:.1f}" if "completion_tokens_mean" in s else "-")
    return table


def examples_table(completions: Sequence[Completion], n: int, title: str = "examples (greedy)") -> Any:
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


def examples_json(completions: Sequence[Completion], n: int) -> list[dict[str, Any]]:
    return [{"prompt": c.sample.prompt, "completion": c.text, "answer": c.sample.answer,
             "extracted": c.score.extracted, "correct": bool(c.score.correct)} for c in list(completions)[:n]]



class TextEvaluator:
    def __init__(self, task: TextTask | None, policies: Any, settings: EvalSettings, tools: Toolbox = NO_TOOLS):
        self.task, self.policies, self.settings, self.tools = task, policies, settings, tools

    @property
    def new_tokens(self) -> int:
        return int(self.settings.max_new_tokens) if self.settings.max_new_tokens else int(self.task.max_new_tokens)

    def check_video(self, video: int, size: int) -> None:
        if video:
            raise UserError("text tasks have no video to record: use video=0")

    def evaluate(self, policy: Any, episodes: int, seed: int, deterministic: bool = True, label: str = "policy",
                 on_batch: Callable[[int], None] | None = None, pass_k: int = 0, batch: int = 64,
                 generator: Any = None, examples: int = 8, **_embodied: Any) -> Evaluation:
        """Greedy pass@1 (``accuracy``) on prompts ``seed .. seed+episodes-1``; sampled pass@k
        with ``pass_k`` > 0 (a prompt counts solved when any of k samples is correct;
        ``sampled_accuracy`` is the mean correctness of those samples)."""
        if isinstance(policy, str):
            policy = self.policies.actor(policy, deterministic, seed)
        if episodes < 1 or self.task is None:
            return Evaluation({}, {label: {}}, {}, {"examples": []})
        samples = self.task.prompts([seed + i for i in range(episodes)])
        greedy: list[Completion] = []
        solved = sampled_correct = 0
        if pass_k > 0 and generator is None:
            generator = torch.Generator(device=policy.device).manual_seed(int(seed))
        for start in range(0, episodes, batch):
            chunk = samples[start:start + batch]
            greedy += sample_completions(policy, self.task, chunk, 1, self.new_tokens, greedy=True, tools=self.tools)
            if pass_k > 0:
                comps = sample_completions(policy, self.task, chunk, pass_k, self.new_tokens, generator=generator,
                                           tools=self.tools)
                ok = np.array([bool(c.score.correct) for c in comps]).reshape(len(chunk), pass_k)  # [prompt, sample]
                solved += int(ok.any(axis=1).sum())
                sampled_correct += int(ok.sum())
            if on_batch is not None:
                on_batch(len(chunk))
        summary = {"prompts": float(episodes), "accuracy": accuracy(greedy),
                   "reward_mean": sum(c.score.reward for c in greedy) / episodes,
                   "completion_tokens_mean": sum(sum(c.loss_mask) for c in greedy) / episodes,
                   **episode_metrics(greedy, bool(self.tools), prefix="")}
        if pass_k > 0:
            summary[f"pass@{pass_k}"] = solved / episodes
            summary["sampled_accuracy"] = sampled_correct / (episodes * pass_k)
        return Evaluation(summary, {label: summary}, {f"eval/{k}": v for k, v in summary.items()},
                          {"examples": examples_json(greedy, examples)},
                          examples_table(greedy, examples) if examples > 0 else None)

    def table(self, rows: dict[str, dict[str, float]], title: str, instructions: dict[str, str] | None = None) -> Any:
        return summary_table(rows, title)  # text rows carry no instructions
