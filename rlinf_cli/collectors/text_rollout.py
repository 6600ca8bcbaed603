"""The text rollout: groups of a language model's completions of fresh prompts, for `rl`.

"episodes" rollouts are one step of ``groups x group_size`` completions (groups side by side,
refilled where the algorithm drops a group: DAPO's dynamic sampling); "steps" rollouts
``rollout_steps x num_envs`` one-step episodes of fresh prompts (text_sampling.py lays them out).
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import torch

from rlinf_cli.algorithm import Algorithm
from rlinf_cli.api import TextTask
from rlinf_cli.collectors.base import training_seeds
from rlinf_cli.collectors.roles import RolloutSettings
from rlinf_cli.collectors.text_sampling import (Completion, RolloutStats, accuracy, episode_metrics, sample_completions,
                                                to_experience)
from rlinf_cli.collectors.text_tools import NO_TOOLS, Toolbox
from rlinf_cli.errors import UserError
from rlinf_cli.experience import Experience


class TextRollout:
    unit = "iterations"  # `rl`'s budget: text.iterations

    def __init__(self, task: TextTask | None, settings: RolloutSettings, tools: Toolbox = NO_TOOLS):
        self.task, self.settings, self.tools = task, settings, tools
        self._last = RolloutStats()
        self._rank, self._world = 0, 1

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
        return []

    def _seeds(self, iteration: int, round_: int, n: int) -> list[int]:
        return training_seeds(int(self.settings.seed), (iteration * self._world + self._rank) * 64 + round_, n)

    def collect(self, policy: Any, algo: Algorithm, iteration: int) -> Experience:
        spec = self._spec
        t0 = time.perf_counter()
        stats = RolloutStats()
        if spec.kind == "steps":  # T x N one-step episodes of fresh prompts
            T, N = spec.steps, int(self.settings.num_envs)
            kept = sample_completions(policy, self.task, self.task.prompts(self._seeds(iteration, 0, T * N)), 1,
                                      self.new_tokens, generator=self.sampler, tools=self.tools,
                                      values=algo.uses_critic)
            stats.seen, stats.prompts_drawn, G, shape = kept, T * N, 1, (T, N)
        else:
            kept, G = self._groups(policy, algo, iteration, spec.groups, spec.group_size, stats), spec.group_size
            shape = (1, len(kept))
        stats.seconds = time.perf_counter() - t0
        stats.generated_tokens = sum(sum(x.loss_mask) for x in stats.seen)
        stats.groups_kept = len(kept) // G
        self._last = stats
        exp = to_experience(policy, kept, G, shape) if kept else None
        if exp is None:  # every group dropped: nothing to learn from this iteration
            exp = Experience({}, {}, torch.zeros(1, 0, 1), *(torch.zeros(1, 0) for _ in range(5)), torch.zeros(0),
                             episode_returns=torch.zeros(0), group_size=G, token_mask=torch.zeros(1, 0, 1))
        exp.env_steps = len(stats.seen)
        return exp

    def _groups(self, policy: Any, algo: Algorithm, iteration: int, groups: int, G: int,
                stats: RolloutStats) -> list[Completion]:
        """``groups`` groups; groups the algorithm filters out are refilled from fresh prompts
        (up to ``algo.refill_rounds()`` extra draws: DAPO's dynamic sampling)."""
        kept: list[Completion] = []
        draw = self._seeds(iteration, 0, groups)
        rounds = algo.refill_rounds()
        for r in range(rounds + 1):
            comps = sample_completions(policy, self.task, self.task.prompts(draw), G, self.new_tokens,
                                       generator=self.sampler, tools=self.tools, values=algo.uses_critic)
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
                **episode_metrics(seen, bool(self.tools))}

    def info(self, metrics: dict[str, float]) -> str:
        return f"reward {metrics['rollout/reward_mean']:.3f}  acc {metrics['rollout/accuracy']:.0%}"

    def state(self) -> dict[str, np.ndarray]:
        """The sampler's RNG: prompts are drawn by iteration, completions from this stream."""
        return {"sampler": self.sampler.get_state().cpu().numpy()}

    def save_files(self, directory: Any) -> None:
        pass

    def close(self) -> None:
        self.tools.close()
