"""The calculator tool: exact arithmetic on what the model writes, parsed, never ``eval``-ed.

A small recursive-descent parser over numbers, ``+ - * /``, unary minus and parentheses that
computes with exact fractions, so ``0.1+0.2`` is ``0.3`` and a product of two 4-digit numbers is
every digit of it. Anything else (names, calls, powers, overly long input) is refused.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from fractions import Fraction
from typing import Any, Mapping

from rlinf_cli.api import ToolError, settings

MAX_EXPR_CHARS = 80  # longer expressions are refused (bounded work per call)
MAX_DIGITS = 30  # numbers with more digits are refused


class CalcError(ValueError):
    """The expression is not something the calculator computes."""


_TOKEN = re.compile(r"\s*(?:(\d+(?:\.\d+)?)|(.))")


def _tokens(expr: str, max_chars: int, max_digits: int) -> list[str]:
    if len(expr) > max_chars:
        raise CalcError("expression too long")
    tokens: list[str] = []
    for number, other in _TOKEN.findall(expr.strip()):
        if number:
            if len(number.replace(".", "")) > max_digits:
                raise CalcError("number too long")
            tokens.append(number)
        elif other.strip():
            if other not in "+-*/()":
                raise CalcError(f"unexpected {other!r}")
            tokens.append(other)
    if not tokens:
        raise CalcError("empty expression")
    return tokens


def calculate(expr: str, max_chars: int = MAX_EXPR_CHARS, max_digits: int = MAX_DIGITS) -> Fraction:
    """Value of an arithmetic expression: numbers, + - * /, unary minus, parentheses.

    Raises :class:`CalcError` for anything else (names, calls, powers, overly long input).
    """
    tokens = _tokens(expr, max_chars, max_digits)
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

    result = expression()
    if pos != len(tokens):
        raise CalcError(f"unexpected {tokens[pos]!r}")
    return result


def format_number(value: Fraction) -> str:
    """An integer exactly; anything else to 6 significant digits."""
    if value.denominator == 1:
        return str(value.numerator)
    return f"{float(value):.6g}"


@dataclass(frozen=True)
class CalculatorConfig:
    max_chars: int = MAX_EXPR_CHARS  # longer expressions are refused
    max_digits: int = MAX_DIGITS  # numbers with more digits are refused

    def __post_init__(self) -> None:
        if self.max_chars < 1 or self.max_digits < 1:
            raise ValueError("max_chars and max_digits must be >= 1")


class Calculator:
    """``calculator({"expression": "123*45"})`` -> ``"5535"``."""

    name = "calculator"
    description = "Exact arithmetic: numbers with + - * / and parentheses. Returns the value."
    parameters = {"type": "object",
                  "properties": {"expression": {"type": "string", "description": "for example (12+3)*45/6"}},
                  "required": ["expression"], "additionalProperties": False}
    timeout_s = 5.0
    example = {"expression": "12*34"}

    def __init__(self, cfg: Mapping[str, Any] | None = None):
        self.cfg = settings.build(CalculatorConfig, cfg, "sim.tool_options.calculator")

    def call(self, arguments: Mapping[str, Any]) -> str:
        try:
            return format_number(calculate(str(arguments["expression"]), self.cfg.max_chars, self.cfg.max_digits))
        except CalcError as exc:
            raise ToolError(str(exc)) from None
