"""Single-turn text tasks: generated arithmetic and GSM8K/MATH-style JSONL files.

Seeds pick prompts. Seeds below ``EVAL_SEED_BASE`` draw from the training split and seeds from it
up to ``VALIDATION_SEED_BASE`` from the held-out split (rlinf's eval seeds start at 1,000,000), so an
evaluation never scores a prompt that training could have seen. Seeds from 2,000,000 (an rl run's
validation, ``eval.best``) draw from the training split again: choosing the kept policy on held-out
prompts would bias the final evaluation of it, and a file's held-out rows leave no room for a
second disjoint set.
"""

from __future__ import annotations

import random
import zlib
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from rlinf_cli.api import settings, TEXT, TEXT_SPEC, Score, TextSample, UserError
from rlinf_sim_reasoning import rewards

EVAL_SEED_BASE = 1_000_000
VALIDATION_SEED_BASE = 2_000_000
ANSWER_FORMATS = ("plain", "hash", "boxed")


def format_answer(answer: str, answer_format: str) -> str:
    """A reference completion for ``answer`` in the task's output format."""
    if answer_format == "hash":
        return f"#### {answer}"
    if answer_format == "boxed":
        return f"\\boxed{{{answer}}}"
    return answer


def check_prompt_settings(answer_format: str, holdout: float, template: str) -> None:
    """The settings every generated task shares: the solutions' format, the held-out fraction and
    the prompt template (raises ValueError, which settings.build turns into one line)."""
    if answer_format not in ANSWER_FORMATS:
        raise ValueError(f"answer_format must be one of {', '.join(ANSWER_FORMATS)}")
    if not 0.0 < holdout < 1.0:
        raise ValueError("holdout must be in (0, 1)")
    if "{question}" not in template:
        raise ValueError("template must contain {question}")


def held_out_seed(seed: int) -> bool:
    """Whether ``seed`` draws from the held-out split (the evaluation seeds, module docstring)."""
    return EVAL_SEED_BASE <= int(seed) < VALIDATION_SEED_BASE


def held_out(key: str, fraction: float) -> bool:
    """Deterministic split of a prompt into the held-out set (crc32 of its text)."""
    return zlib.crc32(key.encode()) % 10_000 < fraction * 10_000


class SingleTurnTask:
    """Shared plumbing: one model turn, no tools, reward from :mod:`rewards`."""

    modality = TEXT
    spec = TEXT_SPEC
    max_turns = 1
    stop: tuple[str, ...] = ()

    def __init__(self, cfg: Any):
        self.cfg = cfg
        self.max_new_tokens = int(cfg.max_new_tokens)
        self.reward_cfg = cfg  # every task config is a rewards.RewardConfig

    def score(self, sample: TextSample, completion: str) -> Score:
        return rewards.score(completion, sample.answer, self.reward_cfg, self.cfg.answer_format)

    def tool_response(self, sample: TextSample, transcript: str) -> str | None:
        return None

    def expert(self) -> None:
        return None  # text tasks ship reference solutions in TextSample.solution instead


@dataclass(frozen=True)
class ArithmeticConfig(rewards.RewardConfig):
    min_digits: int = 1  # fewest digits per operand
    digits: int = 2  # most digits per operand (difficulty)
    terms: int = 2  # operands per problem (difficulty)
    ops: str = "+"  # operators to draw from, any of "+-*"
    template: str = "{question}="  # prompt text; {question} is e.g. "12+34"
    answer_format: str = "plain"  # plain: "46" | hash: "#### 46" | boxed: "\\boxed{46}"
    holdout: float = 0.1  # fraction of distinct problems reserved for evaluation seeds
    max_new_tokens: int = 8  # tokens the model may write
    extract: str = "full"  # the whole completion is the answer: exact match

    def __post_init__(self) -> None:
        super().__post_init__()
        if not 1 <= self.min_digits <= self.digits <= 12:
            raise ValueError("need 1 <= min_digits <= digits <= 12")
        if self.terms < 2 or not self.ops or set(self.ops) - set("+-*"):
            raise ValueError("terms must be >= 2 and ops a non-empty subset of '+-*'")
        check_prompt_settings(self.answer_format, self.holdout, self.template)


def evaluate_terms(numbers: list[int], ops: list[str]) -> int:
    """Value of ``n0 op0 n1 op1 ...`` with * before + and -, computed from our own integers."""
    sums, current = [], numbers[0]
    sign = 1
    for op, n in zip(ops, numbers[1:]):
        if op == "*":
            current *= n
        else:
            sums.append(sign * current)
            sign, current = (1 if op == "+" else -1), n
    sums.append(sign * current)
    return sum(sums)


class ArithmeticTask(SingleTurnTask):
    """Problems like ``47+8=`` -> ``55``: a dial from trivial to hard, with exact answers."""

    def __init__(self, cfg: Mapping[str, Any]):
        super().__init__(settings.build(ArithmeticConfig, cfg, "sim"))

    def problem(self, rng: random.Random) -> tuple[str, str]:
        c = self.cfg
        numbers = []
        for _ in range(c.terms):
            d = rng.randint(c.min_digits, c.digits)
            numbers.append(rng.randint(0 if d == 1 else 10 ** (d - 1), 10 ** d - 1))
        ops = [rng.choice(c.ops) for _ in range(c.terms - 1)]
        question = str(numbers[0]) + "".join(f"{op}{n}" for op, n in zip(ops, numbers[1:]))
        return question, str(evaluate_terms(numbers, ops))

    def prompts(self, seeds: Sequence[int]) -> list[TextSample]:
        out = []
        for seed in seeds:
            want_eval = held_out_seed(seed)
            rng = random.Random(seed)
            for _ in range(10_000):  # rejection: the split decides which problems a seed may draw
                question, answer = self.problem(rng)
                if held_out(question, self.cfg.holdout) == want_eval:
                    break
            else:
                raise UserError("sim: this arithmetic setting has too few distinct problems for a held-out split; raise digits or terms")
            out.append(TextSample(self.cfg.template.format(question=question), answer,
                                  format_answer(answer, self.cfg.answer_format), int(seed)))
        return out


@dataclass(frozen=True)
class JsonlConfig(rewards.RewardConfig):
    path: str = "???"  # JSONL file, one {"question": ..., "answer": ...} object per line
    eval_path: str | None = None  # separate held-out file; null = hold out a fraction of `path`
    holdout: float = 0.1  # without eval_path: fraction of rows (by hash of the question) held out
    question_key: str = "question"  # field with the prompt text
    answer_key: str = "answer"  # field with the reference; GSM8K's "...#### 72" yields 72
    solution_key: str | None = None  # field with a worked solution for SFT; null = the answer field
    template: str = "{question}\n"  # prompt text around the question
    answer_format: str = "hash"  # how solutions end: hash "#### x" | boxed "\\boxed{x}" | plain
    max_new_tokens: int = 256  # tokens the model may write
    reward: str = "numeric"  # numeric answers (GSM8K); math (math-verify equivalence) for symbolic answers (MATH)

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.answer_format not in ANSWER_FORMATS:
            raise ValueError(f"answer_format must be one of {', '.join(ANSWER_FORMATS)}")


def read_jsonl(path: str, question_key: str, answer_key: str) -> list[dict[str, Any]]:
    from rlinf_cli.api import read_rows

    return read_rows(path, (question_key, answer_key), "sim.path", "set sim.question_key / sim.answer_key")


class JsonlTask(SingleTurnTask):
    """Questions and reference answers from a local JSONL file (GSM8K, MATH, your own)."""

    def __init__(self, cfg: Mapping[str, Any]):
        super().__init__(settings.build(JsonlConfig, cfg, "sim"))
        c = self.cfg
        if c.path == "???":
            raise UserError("sim=jsonl needs sim.path=<file.jsonl>")
        rows = read_jsonl(c.path, c.question_key, c.answer_key)
        if c.eval_path:
            self.train, self.test = rows, read_jsonl(c.eval_path, c.question_key, c.answer_key)
        else:
            self.train = [r for r in rows if not held_out(str(r[c.question_key]), c.holdout)]
            self.test = [r for r in rows if held_out(str(r[c.question_key]), c.holdout)]
            if not self.train or not self.test:
                self.train = self.test = rows  # too few rows to split: say so in the docs, not here
        self.spec = TEXT_SPEC

    def sample_of(self, row: Mapping[str, Any], seed: int) -> TextSample:
        c = self.cfg
        raw = str(row[c.answer_key])
        answer = rewards.extract_hash(raw) or rewards.extract_boxed(raw) or raw.strip()
        if c.solution_key and row.get(c.solution_key):
            solution = str(row[c.solution_key])
        elif raw.strip() != answer:
            solution = raw.strip()  # GSM8K style: the answer field is the worked solution
        else:
            solution = format_answer(answer, c.answer_format)
        return TextSample(c.template.format(question=row[c.question_key]), answer, solution, int(seed))

    def prompts(self, seeds: Sequence[int]) -> list[TextSample]:
        out = []
        for seed in seeds:
            rows, offset = (self.test, EVAL_SEED_BASE) if held_out_seed(seed) else (self.train, 0)
            out.append(self.sample_of(rows[(seed - offset) % len(rows)], seed))
        return out
