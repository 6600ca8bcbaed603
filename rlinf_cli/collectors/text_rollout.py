"""The text rollout: groups of a language model's completions of fresh prompts, for `rl`.

"episodes" rollouts are one step of ``groups x group_size`` completions (groups side by side,
refilled where the algorithm drops a group: DAPO's dynamic sampling); "steps" rollouts
``rollout_steps x num_envs`` one-step episodes of fresh prompts (text_sampling.py lays them out).

Sampling runs in this process, or with ``placement.generation.workers=N`` in N generation workers
(text_gen.py) given the weights of the updates done so far (their version); with
``runtime.max_staleness=k >= 1`` the next iteration's first draw is requested before this
iteration's update, so it samples with weights one version old while the trainer updates (the
log-probs recorded at sampling are the ratio's old ones, so PPO/GRPO stay correct).
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import torch

from rlinf_cli.algorithm import Algorithm
from rlinf_cli.api import TextTask
from rlinf_cli.collectors.base import training_seeds
from rlinf_cli.collectors.roles import EnvSettings, RolloutSettings
from rlinf_cli.collectors.text_sampling import (Completion, RolloutStats, accuracy, episode_metrics, sample_completions,
                                                to_experience)
from rlinf_cli.collectors.text_tools import NO_TOOLS, Toolbox
from rlinf_cli.errors import UserError
from rlinf_cli.experience import Experience


class TextRollout:
    unit = "iterations"  # `rl`'s budget: text.iterations

    def __init__(self, task: TextTask | None, settings: RolloutSettings, tools: Toolbox = NO_TOOLS,
                 host: EnvSettings | None = None):
        self.task, self.settings, self.tools, self.host = task, settings, tools, host
        self._last = RolloutStats()
        self._rank, self._world = 0, 1
        self.generation: Any = None  # text_gen.TextGeneration with generation workers
        self._ahead: tuple[int, Any] | None = None  # (iteration, ticket): its first draw, requested early
        self._began = 0.0
        self._ended: float | None = None  # when the last collect returned (time.time())

    @property
    def new_tokens(self) -> int:
        return int(self.settings.max_new_tokens) if self.settings.max_new_tokens else int(self.task.max_new_tokens)

    def budget(self) -> int:
        return int(self.settings.iterations)

    def units(self, state: dict[str, Any]) -> float:
        return float(state["iteration"])

    def start(self, policy: Any, algo: Algorithm, rank: int, world: int, state: dict[str, Any],
              saved: dict[str, np.ndarray] | None) -> list[str]:
        self._rank, self._world = rank, world
        self._spec = algo.rollout_spec()
        self.sampler = torch.Generator(device=policy.device).manual_seed(int(self.settings.seed) * 1_000_003 + rank)
        if saved is not None and "sampler" in saved:  # a resumed run samples on from where it stopped
            self.sampler.set_state(torch.from_numpy(np.ascontiguousarray(saved["sampler"])))
        if self._spec.kind not in ("steps", "episodes"):
            raise UserError(f"algorithm '{algo.name}' learns from rollout='{self._spec.kind}', which text tasks "
                            f"cannot provide; use a steps or episodes algorithm (--algo grpo, rloo, reinforce++, ppo)")
        placement = self.settings.generation
        if placement is None or not placement.workers:
            return []
        from rlinf_cli.collectors import text_gen
        from rlinf_cli.collectors.embodied_env import make_executor
        from rlinf_cli.runtime.placement import runtime_config

        host = self.host or EnvSettings(None, {})
        executor = make_executor(host.executor or {"name": "local"}, host.runtime)
        k = int(self.settings.max_staleness)
        spec = self._spec  # the usual request: T x N prompts of one completion, or the groups of an iteration
        shape = (spec.steps * int(self.settings.num_envs), 1) if spec.kind == "steps" else (spec.groups, spec.group_size)
        self.generation = text_gen.start(executor, policy, self.task, self.tools, placement, runtime_config(host.runtime),
                                         int(state["iteration"]), exact=k == 0, shape=shape)
        how = "synchronous" if k == 0 else "each iteration's first draw requested before the update before it"
        if k == 0 and placement.workers > 1:
            how += ("; a batch is split over the workers where its parts sample the in-process bits"
                    if self.generation.parts_exact else "; batches are not split: this machine's kernels give a part of "
                    "a batch other bits than the whole batch, so one worker samples each, in turn")
        return [f"sampling: {self.generation.pool.label}; runtime.max_staleness={k} ({how})"]

    def _seeds(self, iteration: int, round_: int, n: int) -> list[int]:
        return training_seeds(int(self.settings.seed), (iteration * self._world + self._rank) * 64 + round_, n)

    def collect(self, policy: Any, algo: Algorithm, iteration: int) -> Experience:
        spec = self._spec
        t0 = time.perf_counter()
        self._began = time.time()  # the trainer's update (and bookkeeping) ran from the last collect's end to now
        stats = RolloutStats()
        if spec.kind == "steps":  # T x N one-step episodes of fresh prompts
            T, N = spec.steps, int(self.settings.num_envs)
            kept = self._draw(policy, algo, iteration, 0, self._seeds(iteration, 0, T * N), 1)
            stats.seen, stats.prompts_drawn, G, shape = kept, T * N, 1, (T, N)
        else:
            kept, G = self._groups(policy, algo, iteration, spec.groups, spec.group_size, stats), spec.group_size
            shape = (1, len(kept))
        self._prefetch(policy, algo, iteration)
        stats.seconds = time.perf_counter() - t0
        if self.generation is not None:
            stats.overlap = self._overlap()
        self._ended = time.time()
        stats.generated_tokens = sum(sum(x.loss_mask) for x in stats.seen)
        stats.groups_kept = len(kept) // G
        stats.version = iteration
        self._last = stats
        exp = to_experience(policy, kept, G, shape) if kept else None
        if exp is None:  # every group dropped: nothing to learn from this iteration
            exp = Experience({}, {}, torch.zeros(1, 0, 1), *(torch.zeros(1, 0) for _ in range(5)), torch.zeros(0),
                             episode_returns=torch.zeros(0), group_size=G, token_mask=torch.zeros(1, 0, 1))
        exp.env_steps = len(stats.seen)
        return exp

    def _draw(self, policy: Any, algo: Algorithm, iteration: int, round_: int, seeds: list[int], G: int
              ) -> list[Completion]:
        """``G`` completions of each seed's prompt, with the weights of ``iteration`` updates (a draw
        requested early, before the last update, was sampled with those before it)."""
        if self.generation is None:
            comps = sample_completions(policy, self.task, self.task.prompts(seeds), G, self.new_tokens,
                                       generator=self.sampler, tools=self.tools, values=algo.uses_critic)
            for c in comps:
                c.weight_version = iteration
            return comps
        ahead, self._ahead = self._ahead, None
        if ahead is not None and ahead[0] == iteration and round_ == 0:
            ticket = ahead[1]
        else:
            if ahead is not None:  # requested for another iteration (cannot happen in rl's loop): let it end unused
                self.generation.pool.wait(ahead[1].pending)
            ticket = self.generation.submit(policy, self.task.prompts(seeds), G, self.new_tokens, algo.uses_critic,
                                            self.sampler, iteration)
        return self.generation.wait(ticket, policy, self.sampler, iteration)

    def _prefetch(self, policy: Any, algo: Algorithm, iteration: int) -> None:
        """With max_staleness >= 1: request the next iteration's first draw now, before this update."""
        if self.generation is None or not self.settings.max_staleness or iteration + 1 >= self.budget():
            return
        spec = self._spec
        n, G = (spec.steps * int(self.settings.num_envs), 1) if spec.kind == "steps" else (spec.groups, spec.group_size)
        seeds = self._seeds(iteration + 1, 0, n)
        self._ahead = (iteration + 1, self.generation.submit(policy, self.task.prompts(seeds), G, self.new_tokens,
                                                             algo.uses_critic, self.sampler, iteration))

    def _groups(self, policy: Any, algo: Algorithm, iteration: int, groups: int, G: int,
                stats: RolloutStats) -> list[Completion]:
        """``groups`` groups; groups the algorithm filters out are refilled from fresh prompts
        (up to ``algo.refill_rounds()`` extra draws: DAPO's dynamic sampling)."""
        kept: list[Completion] = []
        draw = self._seeds(iteration, 0, groups)
        rounds = algo.refill_rounds()
        for r in range(rounds + 1):
            comps = self._draw(policy, algo, iteration, r, draw, G)
            stats.seen += comps
            stats.prompts_drawn += len(draw)
            keep = algo.filter_groups(torch.tensor([x.score.reward for x in comps], dtype=torch.float32))
            for g in range(len(draw)):
                if keep is None or bool(keep[g]):
                    kept += comps[g * G:(g + 1) * G]
                else:
                    stats.groups_dropped += 1
            have = len(kept) // G
            if have >= groups or r == rounds:
                break
            draw = self._seeds(iteration, r + 1, groups)[: groups - have]
        return kept[: groups * G]

    @torch.no_grad()
    def logprobs(self, policy: Any, exp: Experience) -> torch.Tensor:
        out = policy.evaluate(exp.obs, exp.actions, with_entropy=False)
        return out.logprob.reshape(exp.logprobs.shape)

    def metrics(self, exp: Experience, seconds: float = 0.0) -> dict[str, float]:
        """Rollout numbers of ``exp``, which took ``seconds`` to sample and learn from."""
        s, seen = self._last, self._last.seen
        rewards = [x.score.reward for x in seen]
        return {"rollout/reward_mean": sum(rewards) / max(len(rewards), 1), "rollout/accuracy": accuracy(seen),
                "rollout/completion_tokens_mean": s.generated_tokens / max(len(seen), 1),
                "rollout/generated_tokens": float(s.generated_tokens),
                "rollout/groups_dropped": float(s.groups_dropped), "rollout/groups_kept": float(s.groups_kept),
                "time/env_steps_per_s": len(seen) / max(seconds, 1e-9),
                "time/generated_tokens_per_s": s.generated_tokens / max(seconds, 1e-9),
                **episode_metrics(seen, bool(self.tools)), **self._generation_metrics()}

    def _generation_metrics(self) -> dict[str, float]:
        """With generation workers: how stale the samples were, restarts and weight-sync seconds."""
        if self.generation is None:
            return {}
        seen, sync = self._last.seen, self.generation.pool.take_stats()
        parts, self.generation.parts = self.generation.parts, []
        lag = sum(self._last.version - c.weight_version for c in seen) / max(len(seen), 1)
        busy, both, frac = self._last.overlap
        return {"rollout/weight_version_lag": float(lag), "rollout/runtime/generation_restarts": sync["restarts"],
                "rollout/runtime/generation_parts": sum(parts) / max(len(parts), 1), "time/weight_sync_s": sync["sync_s"],
                "time/generation_busy_s": busy, "time/generation_overlap_s": both, "time/generation_overlap_frac": frac}

    def _overlap(self) -> tuple[float, float, float]:
        """Seconds the workers sampled this iteration's requests, of those the seconds the trainer was
        updating at the same time (from the last collect's end to this one's start), and that overlap as
        a fraction of the iteration's wall time (the last update and this collect). Wall clocks of the
        workers' machines (time.time()): across nodes as exact as their clocks agree."""
        spans, self.generation.busy = self.generation.busy, []
        busy = sum(e - b for b, e in spans)
        last = self._ended
        if last is None:
            return busy, 0.0, 0.0
        both = sum(max(0.0, min(e, self._began) - max(b, last)) for b, e in spans)
        return busy, both, both / max(time.time() - last, 1e-9)

    def info(self, metrics: dict[str, float]) -> str:
        return f"reward {metrics['rollout/reward_mean']:.3f}  acc {metrics['rollout/accuracy']:.0%}"

    def state(self) -> dict[str, np.ndarray]:
        """The sampler's RNG: prompts are drawn by iteration, completions from this stream."""
        return {"sampler": self.sampler.get_state().cpu().numpy()}

    def save_files(self, directory: Any) -> None:
        pass

    def close(self) -> None:
        if self.generation is not None:
            self.generation.pool.close(in_flight=self._ahead is not None)
            self.generation, self._ahead = None, None
        self.tools.close()
