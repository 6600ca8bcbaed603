"""The text recorder: JSONL datasets of prompt/completion pairs. `collect` appends the task's
reference solutions or a checkpoint's sampled completions (rejection sampling with
``only_success``), with provenance beside the file; `sft` reads them back (``datasets.TextDataset``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import torch

from rlinf_cli.api import TextTask
from rlinf_cli.collectors.base import training_seeds
from rlinf_cli.collectors.datasets import META_SUFFIX, TextDataset, read_meta
from rlinf_cli.collectors.roles import RecordSettings
from rlinf_cli.collectors.text_sampling import sample_completions
from rlinf_cli.collectors.text_tools import NO_TOOLS, Toolbox
from rlinf_cli.errors import UserError
from rlinf_cli.locks import FileLock
from rlinf_cli.settings import plain

class TextWriter:
    """Appends prompt/completion rows to a JSONL file (one writer at a time), with provenance
    in ``<file>.meta.json``; each append draws new prompts."""

    def __init__(self, path: str, provenance: dict[str, Any]):
        self.path = Path(path)
        if self.path.suffix != ".jsonl":
            raise UserError(f"output '{self.path}': text tasks write a JSONL file; use output=<name>.jsonl")
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise UserError(f"cannot create '{self.path.parent}': {exc.strerror}; choose a writable output=...") from exc
        self._lock = FileLock(self.path.with_name(f".{self.path.name}.lock")).acquire(
            blocking=False, busy=f"'{self.path}' is being written by another rlinf collect (pid {{pid}}); wait for it "
                                 f"or choose another output=")
        self.meta = (read_meta(str(self.path)) if self.path.exists() else {}) or {
            "format": "rlinf-text-jsonl", "fields": ["prompt", "completion", "answer", "seed"], "provenance": []}
        self.provenance = dict(provenance)
        self.rows: list[dict[str, Any]] = []
        self.added = 0
        self.meta_path = Path(str(self.path) + META_SUFFIX)

    @property
    def episodes_written(self) -> int:
        return sum(int(p.get("rows", 0)) for p in self.meta["provenance"]) + len(self.rows)

    def seed_key(self) -> int:
        """Appends so far: each draws its prompts from its own seed segment."""
        return len(self.meta["provenance"])

    def add(self, row: dict[str, Any]) -> None:
        self.rows.append(row)

    def close(self) -> None:
        if self.rows:
            with self.path.open("a", encoding="utf-8") as f:
                f.writelines(json.dumps(r) + "\n" for r in self.rows)
            self.meta["provenance"].append({**self.provenance, "rows": len(self.rows)})
            self.meta_path.write_text(json.dumps(self.meta, indent=2))
            self.added += len(self.rows)
            self.rows = []
        self._lock.release()



def provenance_sim(path: str) -> tuple[dict[str, Any] | None, str | None]:
    """The text task a JSONL written by `rlinf collect` came from: (sim node, sim choice)."""
    prov = (read_meta(path).get("provenance") or [{}])[-1]
    sim = prov.get("sim")
    return (plain(sim) if sim else None), prov.get("sim_choice", (sim or {}).get("name"))


class TextRecorder:
    def __init__(self, task: TextTask | None, policies: Any, settings: RecordSettings, device: Any = "cpu",
                 tools: Toolbox = NO_TOOLS):
        self.task, self.policies, self.settings, self.device, self.tools = task, policies, settings, device, tools

    @property
    def new_tokens(self) -> int:
        return int(self.settings.max_new_tokens) if self.settings.max_new_tokens else int(self.task.max_new_tokens)

    def dataset(self, path: str, val_fraction: float, seed: int) -> Any:
        return TextDataset(path, val_fraction, seed, self.device, self.settings.text)

    def writer(self, output: str, provenance: dict[str, Any], chunk: int) -> TextWriter:
        # the tools the transcripts call, as the prompts described them: `sft` describes them the same way
        return TextWriter(output, {**provenance, **({"tools": self.tools.schemas} if self.tools else {})})

    def demos_summary(self, kept: Sequence[dict[str, Any]]) -> dict[str, float]:
        return {"prompts": float(len(kept)), "accuracy": float(np.mean([r.get("correct", True) for r in kept]))
                if kept else 0.0}

    def record(self, writer: TextWriter, source: str, want: int, only_success: bool, progress: Any) -> list[Any]:
        """Rows for `sft`: the task's reference solutions (``expert``) or a checkpoint's sampled
        completions (``only_success`` keeps correct ones: rejection sampling)."""
        s = self.settings
        samples = self.task.prompts(training_seeds(int(s.seed), writer.seed_key(), want))
        if source == "expert":
            for x in samples:
                writer.add({"prompt": x.prompt, "completion": x.solution, "answer": x.answer, "seed": x.seed})
            progress.update(len(samples))
            return list(writer.rows)
        policy = self.policies.policy(source)
        k = int(s.samples)
        gen = torch.Generator(device=policy.device).manual_seed(int(s.seed))
        for start in range(0, want, 64):
            chunk = samples[start:start + 64]
            for c in sample_completions(policy, self.task, chunk, k, self.new_tokens,
                                        greedy=bool(s.deterministic) and k == 1, generator=gen, tools=self.tools):
                if c.score.correct or not only_success:
                    writer.add({"prompt": c.sample.prompt, "completion": c.text, "answer": c.sample.answer,
                                "seed": c.sample.seed, "correct": bool(c.score.correct)})
            progress.update(len(chunk))
        return list(writer.rows)
