"""Any reasoning-gym dataset as a text task, scored by the dataset's own verifier.

`reasoning-gym <https://github.com/open-thought/reasoning-gym>`_ generates procedural reasoning
problems (arithmetic, algebra, logic, puzzles, ~100 datasets) item by item from a seed, each with
a ``score_answer`` that knows what counts as correct (an order-free list, an equivalent
expression). ``sim=reasoning_gym sim.task=chain_sum "sim.params={min_terms: 2, max_terms: 3}"``.

Splits, like the other text tasks: a question is held out when the crc32 of its text falls in the
``holdout`` fraction. Training seeds draw random items and skip held-out ones; evaluation seed
``1_000_000 + k`` is the k-th *distinct* held-out question in item order, so ``eval.episodes=200``
scores 200 different problems none of which training can see.
"""

from __future__ import annotations

import difflib
import random
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from rlinf_cli.api import settings, Score, TextSample, UserError
from rlinf_sim_reasoning import rewards
from rlinf_sim_reasoning.tasks import (EVAL_SEED_BASE, SingleTurnTask, check_prompt_settings, format_answer, held_out,
                                       held_out_seed)

MAX_WALK = 200_000  # items generated while looking for held-out questions before giving up
STALE_WALK = 20_000  # ... or this many items in a row without a new one (the space is used up)
ITEM_SPACE = 2 ** 31  # item indices a training seed may draw (datasets generate item i from seed + i)


@dataclass(frozen=True)
class ReasoningGymConfig(rewards.RewardConfig):
    task: str = "chain_sum"  # reasoning-gym dataset name (`reasoning_gym.factory.DATASETS`)
    params: dict[str, Any] | None = None  # the dataset's own config keys; None = its defaults
    data_seed: int = 0  # reasoning-gym's seed: which problems exist
    holdout: float = 0.1  # fraction of distinct questions (by hash) reserved for eval seeds
    template: str = "{question}"  # prompt text around the dataset's question
    partial_credit: bool = False  # reward = the scorer's value in [0, 1]; false: 1 only when fully right
    answer_format: str = "plain"  # how reference solutions (SFT data) write the answer
    max_new_tokens: int = 64  # tokens the model may write
    reward: str = "dataset"  # dataset: the dataset's score_answer | exact | numeric | math

    reward_modes = (*rewards.REWARD_MODES, "dataset")

    def __post_init__(self) -> None:
        super().__post_init__()
        check_prompt_settings(self.answer_format, self.holdout, self.template)


def make_dataset(name: str, params: Mapping[str, Any] | None, seed: int) -> Any:
    """The reasoning-gym dataset ``name`` with ``params``; a bad name or parameter is one line."""
    import reasoning_gym  # ~100 dataset modules: loaded when the task is built, not when plugins register
    from reasoning_gym.factory import DATASETS

    if name not in DATASETS:
        close = difflib.get_close_matches(name, DATASETS, n=3)
        hint = f" (did you mean {', '.join(close)}?)" if close else ""
        raise UserError(f"sim.task: reasoning-gym has no dataset '{name}'{hint}; "
                        f"`python -c 'import reasoning_gym.factory as f; print(sorted(f.DATASETS))'` lists them")
    try:
        return reasoning_gym.create_dataset(name, seed=seed, size=ITEM_SPACE, **dict(params or {}))
    except (TypeError, ValueError, AssertionError) as exc:
        raise UserError(f"sim.params for reasoning-gym '{name}': {str(exc).splitlines()[0] or type(exc).__name__}; "
                        f"see the dataset's config class in reasoning_gym") from exc


class ReasoningGymTask(SingleTurnTask):
    """Prompts from a reasoning-gym dataset; rewards from its ``score_answer``."""

    def __init__(self, cfg: Mapping[str, Any]):
        c = settings.build(ReasoningGymConfig, cfg, "sim")
        super().__init__(c)
        self.dataset = make_dataset(c.task, c.params, c.data_seed)
        self._eval_items: list[int] = []  # item indices of distinct held-out questions, in order
        self._eval_seen: set[str] = set()
        self._walked = self._last_new = 0
        self._items: dict[int, int] = {}  # prompt seed -> item index (score() finds the entry again)

    def _held_out(self, question: str) -> bool:
        return held_out(question, self.cfg.holdout)

    def _eval_item(self, k: int) -> int:
        while len(self._eval_items) <= k:
            if self._walked >= MAX_WALK or self._walked - self._last_new >= STALE_WALK:
                raise UserError(f"sim: reasoning-gym '{self.cfg.task}' with these params gave only "
                                f"{len(self._eval_items)} distinct held-out questions in {self._walked} items; "
                                f"ask for fewer eval episodes, raise sim.holdout or widen sim.params")
            question = self.dataset[self._walked]["question"]
            if self._held_out(question) and question not in self._eval_seen:
                self._eval_seen.add(question)
                self._eval_items.append(self._walked)
                self._last_new = self._walked
            self._walked += 1
        return self._eval_items[k]

    def _train_item(self, seed: int) -> int:
        rng = random.Random(seed)
        for _ in range(1_000):
            idx = rng.randrange(ITEM_SPACE)
            if not self._held_out(self.dataset[idx]["question"]):
                return idx
        raise UserError(f"sim: reasoning-gym '{self.cfg.task}' drew only held-out questions; lower sim.holdout")

    def prompts(self, seeds: Sequence[int]) -> list[TextSample]:
        out = []
        for seed in seeds:
            seed = int(seed)
            idx = self._eval_item(seed - EVAL_SEED_BASE) if held_out_seed(seed) else self._train_item(seed)
            self._items[seed] = idx
            entry = self.dataset[idx]
            answer = str(entry["answer"])
            out.append(TextSample(self.cfg.template.format(question=entry["question"]), answer,
                                  format_answer(answer, self.cfg.answer_format), seed))
        return out

    def entry(self, sample: TextSample) -> dict[str, Any]:
        """The dataset item behind ``sample`` (regenerated from its seed: items are deterministic)."""
        idx = self._items.get(sample.seed)
        if idx is None:
            self.prompts([sample.seed])
            idx = self._items[sample.seed]
        return self.dataset[idx]

    def score(self, sample: TextSample, completion: str) -> Score:
        c = self.cfg
        if c.reward != "dataset":
            return super().score(sample, completion)
        pred = rewards.extract_answer(completion, c.extract)
        try:
            value = float(self.dataset.score_answer(pred, self.entry(sample))) if pred is not None else 0.0
        except Exception:  # a scorer choking on odd model output is a wrong answer, not a crashed run
            value = 0.0
        correct = value >= 1.0
        reward = value if c.partial_credit else float(correct)
        if c.format_reward and rewards.has_format(completion, c.answer_format):
            reward += c.format_reward
        return Score(reward, correct, pred)
