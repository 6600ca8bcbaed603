"""A multi-turn tool-use task: the model may call a calculator and reads its result before answering.

Transcript of a good episode (``<calc>``/``</calc>`` ends a model turn; the task appends the
``<result>`` text, which is context, not policy output)::

    What is 123*45?            <- prompt
    <calc>123*45</calc>        <- model turn 1 (stops at "</calc>")
    <result>5535</result>      <- tool output appended by the task
    #### 5535                  <- model turn 2, scored

The calculator is a small recursive-descent parser over numbers, + - * / and parentheses that
computes with exact fractions: model output is never passed to ``eval``.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass
from fractions import Fraction
from typing import Any, Mapping, Sequence

from rlinf_cli.api import settings, TextSample
from rlinf_sim_reasoning import rewards
from rlinf_sim_reasoning.tasks import EVAL_SEED_BASE, SingleTurnTask, evaluate_terms, held_out

CALL_OPEN, CALL_CLOSE = "<calc>", "</calc>"
MAX_EXPR_CHARS = 80  # longer calls are refused (bounded work per call)
MAX_DIGITS = 30  # numbers with more digits are refused


class CalcError(ValueError):
    """The expression is not something the calculator computes."""


_TOKEN = re.compile(r"\s*(?:(\d+(?:\.\d+)?)|(.))")


def calculate(expr: str) -> Fraction:
    """Value of an arithmetic expression: numbers, + - * /, unary minus, parentheses.

    Raises :class:`CalcError` for anything else (names, calls, powers, overly long input).
    """
    if len(expr) > MAX_EXPR_CHARS:
        raise CalcError("expression too long")
    tokens: list[str] = []
    for number, other in _TOKEN.findall(expr.strip()):
        if number:
            if len(number.replace(".", "")) > MAX_DIGITS:
                raise CalcError("number too long")
            tokens.append(number)
        elif other.strip():
            if other not in "+-*/()":
                raise CalcError(f"unexpected {other!r}")
            tokens.append(other)
    pos = 0

    def peek() -> str | None:
        return tokens[pos] if pos < len(tokens) else None

    def take() -> str:
        nonlocal pos
        if pos >= len(tokens):
            raise CalcError("unexpected end")
        pos += 1
        return tokens[pos - 1]

    def expression() -> Fraction:
        value = term()
        while peek() in ("+", "-"):
            value = value + term() if take() == "+" else value - term()
        return value

    def term() -> Fraction:
        value = factor()
        while peek() in ("*", "/"):
            op = take()
            rhs = factor()
            if op == "/" and rhs == 0:
                raise CalcError("division by zero")
            value = value * rhs if op == "*" else value / rhs
        return value

    def factor() -> Fraction:
        tok = take()
        if tok == "-":
            return -factor()
        if tok == "(":
            value = expression()
            if take() != ")":
                raise CalcError("missing )")
            return value
        if tok[0].isdigit():
            return Fraction(tok)
        raise CalcError(f"unexpected {tok!r}")

    if not tokens:
        raise CalcError("empty expression")
    result = expression()
    if pos != len(tokens):
        raise CalcError(f"unexpected {tokens[pos]!r}")
    return result


def format_number(value: Fraction) -> str:
    if value.denominator == 1:
        return str(value.numerator)
    return f"{float(value):.6g}"


@dataclass(frozen=True)
class CalculatorConfig(rewards.RewardConfig):
    min_digits: int = 2  # fewest digits per operand
    digits: int = 3  # most digits per operand
    terms: int = 2  # operands per problem
    ops: str = "*"  # operators to draw from, any of "+-*"
    template: str = "What is {question}?\n"  # prompt text
    holdout: float = 0.1  # fraction of problems reserved for evaluation seeds
    max_turns: int = 3  # model turns per episode (tool calls + the final answer)
    max_new_tokens: int = 24  # tokens per model turn
    tool_reward: float = 0.0  # added when the episode made at least one well-formed tool call
    answer_format: str = "hash"  # the final answer is written "#### x"
    reward: str = "numeric"
    extract: str = "hash"

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.max_turns < 1:
            raise ValueError("max_turns must be >= 1")
        if not 1 <= self.min_digits <= self.digits <= 12 or self.terms < 2 or not self.ops or set(self.ops) - set("+-*"):
            raise ValueError("need 1 <= min_digits <= digits <= 12, terms >= 2 and ops a subset of '+-*'")


class CalculatorTask(SingleTurnTask):
    """Arithmetic too hard to do in one's head, with a calculator tool one call away."""

    stop = (CALL_CLOSE,)

    def __init__(self, cfg: Mapping[str, Any]):
        super().__init__(settings.build(CalculatorConfig, cfg, "sim"))
        self.max_turns = int(self.cfg.max_turns)

    def prompts(self, seeds: Sequence[int]) -> list[TextSample]:
        c = self.cfg
        out = []
        for seed in seeds:
            rng = random.Random(seed)
            for _ in range(10_000):
                nums = [rng.randint(10 ** (d - 1) if d > 1 else 0, 10 ** d - 1)
                        for d in (rng.randint(c.min_digits, c.digits) for _ in range(c.terms))]
                ops = [rng.choice(c.ops) for _ in range(c.terms - 1)]
                question = str(nums[0]) + "".join(f"{o}{n}" for o, n in zip(ops, nums[1:]))
                if held_out(question, c.holdout) == (seed >= EVAL_SEED_BASE):
                    break
            answer = str(evaluate_terms(nums, ops))
            solution = f"{CALL_OPEN}{question}{CALL_CLOSE}{self.result_text(question)}#### {answer}"
            out.append(TextSample(c.template.format(question=question), answer, solution, int(seed)))
        return out

    @staticmethod
    def result_text(expr: str) -> str:
        try:
            return f"<result>{format_number(calculate(expr))}</result>\n"
        except CalcError as exc:
            return f"<result>error: {exc}</result>\n"

    def tool_response(self, sample: TextSample, transcript: str) -> str | None:
        """If the last model turn ends with a ``<calc>...</calc>`` call, the calculator's result."""
        if not transcript.endswith(CALL_CLOSE):
            return None
        start = transcript.rfind(CALL_OPEN)
        if start < 0:
            return None
        return self.result_text(transcript[start + len(CALL_OPEN): -len(CALL_CLOSE)])

    def score(self, sample: TextSample, completion: str):
        s = super().score(sample, completion)
        if self.cfg.tool_reward and "<result>" in completion and "error:" not in completion:
            return type(s)(s.reward + self.cfg.tool_reward, s.correct, s.extracted)
        return s
