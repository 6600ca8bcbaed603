"""The embodied recorder: demonstration episodes for `collect` (an rlinf or LeRobot dataset) and
the parquet datasets `sft` learns from."""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np
from omegaconf import OmegaConf

from rlinf_cli.collectors.datasets import EpisodeBuffer, EpisodeDataset, with_noise
from rlinf_cli.collectors.embodied_env import EmbodiedEnv
from rlinf_cli.collectors.embodied_eval import summarize
from rlinf_cli.collectors.roles import RecordSettings
from rlinf_cli.data.dataset import DatasetWriter
from rlinf_cli.data.lerobot_writer import writer_for
from rlinf_cli.errors import UserError
from rlinf_cli.runtime.chunking import ChunkedSimulator
from rlinf_cli.runtime.rollout import EpisodeStats, run_episodes


class EmbodiedRecorder:
    def __init__(self, env: EmbodiedEnv, policies: Any, settings: RecordSettings, note: Any = print):
        self.env, self.policies, self.settings = env, policies, settings
        self.note = note  # one line to the user (RunContext.note)

    def dataset(self, path: str, val_fraction: float, seed: int) -> EpisodeDataset:
        return EpisodeDataset(path, val_fraction, seed, self.env.device, (self.settings.lerobot or {}).get("features"))

    def writer(self, output: str, provenance: dict[str, Any], chunk: int) -> Any:
        """The dataset writer ``format`` names: rlinf's own, or LeRobot v3.0 (rlinf_cli/data/lerobot.py)."""
        s = self.settings
        if s.format == "lerobot":
            opts = OmegaConf.create({"lerobot": s.lerobot or {}, "sim": {"name": s.sim_name}, "output": output,
                                     "chunk_episodes": chunk})  # the keys writer_for reads
            writer = writer_for(opts, self.env.sim, provenance)
        else:
            writer = DatasetWriter(output, self.env.spec, provenance, chunk)
        # appending continues after every seed tried before (kept or dropped by only_success)
        writer.provenance["first_seed"] = writer.seed_after(int(s.seed) + writer.episodes_written)
        return writer

    def record(self, writer: Any, source: str, want: int, only_success: bool, progress: Any) -> list[Any]:
        """Run ``source`` (random, expert or a checkpoint; with ``action_noise`` / ``epsilon``) on
        fresh seeds and append the episodes it keeps to ``writer`` until ``want`` are kept."""
        s, first_seed = self.settings, writer.provenance["first_seed"]
        actor = self.policies.actor(source, bool(s.deterministic), int(s.seed))
        if isinstance(self.env.sim, ChunkedSimulator):
            raise UserError(f"'{source}' acts in chunks of {self.env.sim.k} actions: datasets hold one action per step, "
                            "so collect demonstrations with policy=expert or a one-step policy")
        spec = self.env.spec
        act = with_noise(actor, spec, float(s.action_noise), float(s.epsilon), np.random.default_rng(int(s.seed)))
        n = max(1, min(int(s.num_envs), want))
        env = self.env.executor(act, n).make_vec_env(self.env.sim, n, autoreset=False)
        kept: list[Any] = []
        tried = 0
        try:
            while len(kept) < want:
                if tried >= 20 * want:
                    self.note(f"stopping: {tried} episodes tried, {len(kept)} kept "
                              f"(only_success=true and the policy rarely succeeds)")
                    break
                seeds = [first_seed + tried + i for i in range(n)]
                buf = EpisodeBuffer(n)
                stats = run_episodes(env, act, seeds, buf)
                tried += n
                writer.next_seed = first_seed + tried
                for i, st in enumerate(stats):
                    if len(kept) >= want or (only_success and not st.success_once):
                        continue
                    kept.append(buf.episode(i, seeds[i]))
                    writer.add(kept[-1])
                    progress.update(1, (f"success {np.mean([e.success.any() for e in kept]):.0%}  "
                                        if spec.has_success else "")
                                    + f"return {np.mean([e.rewards.sum() for e in kept]):.1f}")
        finally:
            env.close()
        return kept

    def demos_summary(self, kept: Sequence[Any]) -> dict[str, float]:
        return summarize([EpisodeStats(float(e.rewards.sum()), len(e), bool(e.success.any()), bool(e.success[-1]))
                          for e in kept], self.env.spec.has_success)
