"""The embodied evaluator: held-out episodes of a policy (or random / expert) on a simulator,
summarized per policy and, for multi-task simulators, per task; the first N recorded to video.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np
from rich.table import Table

from rlinf_cli.api import Simulator
from rlinf_cli.collectors.base import Evaluation
from rlinf_cli.collectors.embodied_env import EmbodiedEnv
from rlinf_cli.collectors.roles import EvalSettings
from rlinf_cli.collectors.videos import evaluate_with_video, video_source
from rlinf_cli.runtime.rollout import EpisodeStats, Recorder, run_episodes
from rlinf_cli.tables import RESULT_HEADERS, RESULT_LEGEND, instruction_notes, result_cells, with_notes


# -- summaries and tables ----------------------------------------------------------------------
def summarize(episodes: Sequence[EpisodeStats], has_success: bool = True) -> dict[str, float]:
    """Mean/std return, success rates (only where the simulator reports success), mean length."""
    if not episodes:
        return {}
    rets = np.array([e.ret for e in episodes])
    out = {"episodes": float(len(episodes)), "return_mean": float(rets.mean()), "return_std": float(rets.std())}
    if has_success:
        out["success_once"] = float(np.mean([e.success_once for e in episodes]))
        out["success_at_end"] = float(np.mean([e.success_at_end for e in episodes]))
    out["length_mean"] = float(np.mean([e.length for e in episodes]))
    return out


def summarize_by_task(episodes: Sequence[EpisodeStats], tasks: Sequence[str],
                      has_success: bool = True) -> dict[str, dict[str, float]]:
    """Task name -> :func:`summarize` of its episodes, for simulators with several tasks."""
    by_task = {name: [e for e in episodes if e.task == index] for index, name in enumerate(tasks)}
    return {name: summarize(mine, has_success) for name, mine in by_task.items() if mine}


def task_mean(per_task: dict[str, dict[str, float]]) -> dict[str, float]:
    """Each number averaged over tasks (every task weighs the same, whatever its episode count)."""
    if not per_task:
        return {}
    keys = set.intersection(*(set(s) for s in per_task.values()))
    out = {k: float(np.mean([s[k] for s in per_task.values()])) for k in sorted(keys)}
    out["episodes"] = float(sum(s["episodes"] for s in per_task.values()))
    out["tasks"] = float(len(per_task))
    return out


def eval_table(rows: dict[str, dict[str, float]], title: str, instructions: dict[str, str] | None = None) -> Any:
    """A rich table: one row per policy/label with the summary numbers; under it the legend and,
    with ``instructions`` (row label -> text), what the policy was told on that row's episodes."""
    table = Table(title=title)
    table.add_column("policy")
    for col in RESULT_HEADERS:
        table.add_column(col, justify="right")
    for label, s in rows.items():
        table.add_row(label, *result_cells(s))
    return with_notes(table, [RESULT_LEGEND, *(instruction_notes(instructions) if instructions else [])])


def instructions_by_row(episodes: Sequence[EpisodeStats], rows: dict[str, Any], label: str,
                        tasks: Sequence[str]) -> dict[str, str]:
    """Row label -> the instruction its episodes were given (several differing: joined with ' | ')."""
    def told(eps: Sequence[EpisodeStats]) -> str:
        return " | ".join(dict.fromkeys(e.instruction for e in eps if e.instruction))

    out = {f"{label} · {name}": told([e for e in episodes if e.task == i]) for i, name in enumerate(tasks)}
    out = {k: v for k, v in out.items() if k in rows and v}
    if label in rows and told(episodes):
        out[label] = told(episodes)
    return out


class EmbodiedEvaluator:
    def __init__(self, env: EmbodiedEnv, policies: Any, settings: EvalSettings):
        self.env, self.policies, self.settings = env, policies, settings

    @property
    def sim(self) -> Simulator:
        return self.env.sim

    def run_episodes(self, act: Callable, episodes: int, seed: int, num_envs: int,
                     recorder_factory: Callable[[], Recorder] | None = None,
                     on_batch: Callable[[list[EpisodeStats]], None] | None = None,
                     sim: Simulator | None = None) -> list[EpisodeStats]:
        """Episodes ``seed, seed+1, ...`` in batches of ``num_envs``; returns them in seed order.
        ``sim``: another simulator to run them on (the same one with a video camera)."""
        if episodes < 1:
            return []
        n = max(1, min(num_envs, episodes))
        env = self.env.executor(act, n).make_vec_env(sim or self.env.sim, n, autoreset=False)
        results: list[EpisodeStats] = []
        try:
            for start in range(0, episodes, n):
                seeds = [seed + start + i for i in range(n)]
                batch = run_episodes(env, act, seeds, recorder_factory() if recorder_factory else None)[: episodes - start]
                results.extend(batch)
                if on_batch is not None:
                    on_batch(batch)
        finally:
            env.close()
        return results

    def check_video(self, video: int, size: int) -> None:
        """Fail now, not after training, when ``video`` > 0 and this simulator cannot render."""
        if video:
            video_source(self.env.sim, size)

    def evaluate(self, policy: Any, episodes: int, seed: int, deterministic: bool = True, label: str = "policy",
                 on_batch: Callable[[int], None] | None = None, video: int = 0, video_dir: Any = None,
                 video_size: int = 256, **_text: Any) -> Evaluation:
        """``episodes`` held-out episodes (seeds ``seed, seed+1, ...``) of ``policy`` (a Policy,
        or ``random`` / ``expert`` / a checkpoint path); the first ``video`` recorded to mp4 files in
        ``video_dir`` (``extra["videos"]``)."""
        if not isinstance(policy, str):
            self.policies.chunk_for(policy)
        act = self.policies.actor(policy, deterministic, seed) if isinstance(policy, str) else \
            self.policies.policy_actor(policy, deterministic)
        eps, files = evaluate_with_video(self, act, episodes, seed, self.settings.num_envs, video, video_dir,
                                         video_size, on_batch=(lambda b: on_batch(len(b))) if on_batch else None)
        spec = self.env.spec
        summary = summarize(eps, spec.has_success)
        extra: dict[str, Any] = {"per_episode": [e.__dict__ for e in eps]}
        if files:
            extra["videos"] = [str(f) for f in files]
        rows, metrics = by_task(eps, spec, label, summary, extra)
        told = instructions_by_row(eps, rows, label, spec.tasks)
        if told:
            extra["instructions"] = told
        return Evaluation(summary, rows, metrics, extra)

    def table(self, rows: dict[str, dict[str, float]], title: str, instructions: dict[str, str] | None = None) -> Any:
        return eval_table(rows, title, instructions)


def by_task(eps: Sequence[EpisodeStats], spec: Any, label: str, summary: dict[str, float],
            extra: dict[str, Any]) -> tuple[dict[str, dict[str, float]], dict[str, float]]:
    """Table rows and metrics of an evaluation; multi-task: one row per task, then the mean over
    tasks (added to ``extra`` as ``per_task`` and ``task_mean``)."""
    rows = {label: summary}
    metrics = {f"eval/{k}": v for k, v in summary.items()}
    if len(spec.tasks) > 1 and eps:
        per_task = summarize_by_task(eps, spec.tasks, spec.has_success)
        mean = task_mean(per_task)
        extra.update(per_task=per_task, task_mean=mean)
        rows = {f"{label} · {task}": s for task, s in per_task.items()}
        rows[f"{label} · mean over {len(per_task)} tasks"] = mean
        metrics.update({f"eval/task/{task}/{k}": v for task, s in per_task.items() for k, v in s.items()})
        metrics.update({f"eval/task_mean/{k}": v for k, v in mean.items()})
    return rows, metrics
