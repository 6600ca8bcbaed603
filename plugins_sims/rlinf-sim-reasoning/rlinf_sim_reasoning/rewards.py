"""Verifiable rewards: answer extraction and comparison, written as plain string parsing.

Model output is untrusted: nothing here evaluates it. Numbers are read with a regular
expression and ``fractions.Fraction``; ``\\boxed{...}`` is matched by counting braces.

Extraction modes (``extract``):
- ``boxed``: the content of the last ``\\boxed{...}`` (nested braces allowed);
- ``tag``: the content of the last ``<answer>...</answer>`` (reasoning-gym's default format);
- ``hash``: the text after the last ``####`` up to the end of its line (GSM8K);
- ``last_number``: the last number in the text;
- ``full``: the whole completion, stripped;
- ``auto``: boxed, else tag, else hash, else an "answer is/answer:" phrase, else the last number.
Comparison modes (``reward``): ``exact`` (normalised strings, or equal numbers when both
sides are numbers), ``numeric`` (numbers within ``tolerance``, relative or absolute) and
``math`` (symbolic equivalence by math-verify: ``\\frac{1}{2}`` = ``0.5``, ``x+1`` = ``1+x``,
intervals and sets; parsed with sympy under a time limit, never executed).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from fractions import Fraction
from typing import ClassVar

from rlinf_cli.api import Score

EXTRACT_MODES = ("auto", "boxed", "tag", "hash", "last_number", "full")
REWARD_MODES = ("exact", "numeric", "math")

# an optional sign, digits with optional thousands separators, optional decimals, or a/b
_NUMBER = re.compile(r"(?<![\w.])[-+\u2212]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?:\s*/\s*\d+)?(?![\w])|"
                     r"(?<![\w.])[-+\u2212]?\.\d+(?![\w])")
_ANSWER_TAG = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
_ANSWER_PHRASE = re.compile(r"answer\s*(?:is|:|=)\s*([^\n]*)", re.IGNORECASE)
_MAX_NUMBER_CHARS = 64  # longer digit strings are not answers (and would make Fraction slow)


def extract_boxed(text: str) -> str | None:
    """Content of the last ``\\boxed{...}`` (or ``\\fbox{...}``), braces balanced; None if absent."""
    start = max(text.rfind("\\boxed{"), text.rfind("\\fbox{"))
    if start < 0:
        return None
    i = text.index("{", start) + 1
    depth = 1
    for j in range(i, len(text)):
        if text[j] == "{":
            depth += 1
        elif text[j] == "}":
            depth -= 1
            if depth == 0:
                return text[i:j].strip()
    return None  # unbalanced: the model stopped mid-answer


def extract_hash(text: str) -> str | None:
    """Text after the last ``####`` up to the end of that line; None if absent or empty."""
    pos = text.rfind("####")
    if pos < 0:
        return None
    rest = text[pos + 4:].strip().split("\n", 1)[0].strip()
    return rest or None


def extract_tag(text: str) -> str | None:
    """Content of the last ``<answer>...</answer>``, stripped; None if absent or empty."""
    found = _ANSWER_TAG.findall(text)
    return (found[-1].strip() or None) if found else None


def extract_last_number(text: str) -> str | None:
    found = _NUMBER.findall(text)
    return found[-1].strip() if found else None


def extract_answer(text: str, mode: str = "auto") -> str | None:
    """The answer a completion gives, as a string (see the module docstring for modes)."""
    if mode == "full":
        return text.strip() or None
    if mode == "boxed":
        return extract_boxed(text)
    if mode == "tag":
        return extract_tag(text)
    if mode == "hash":
        return extract_hash(text)
    if mode == "last_number":
        return extract_last_number(text)
    if mode != "auto":
        raise ValueError(f"unknown extraction mode {mode!r}; choose one of {', '.join(EXTRACT_MODES)}")
    for fn in (extract_boxed, extract_tag, extract_hash):
        got = fn(text)
        if got is not None:
            return got
    phrase = _ANSWER_PHRASE.findall(text)
    if phrase and phrase[-1].strip():
        return phrase[-1].strip().rstrip(".")
    return extract_last_number(text)


def parse_number(text: str | None) -> Fraction | None:
    """A number written as ``-1,234.5``, ``$12``, ``3/4``, ``50%`` or ``\\frac{3}{4}``; None otherwise.

    Exact (Fraction), so 0.1 + 0.2 style float noise cannot flip a reward.
    """
    if text is None:
        return None
    s = text.strip().replace("\u2212", "-").replace("$", "").replace("\\!", "").strip()
    s = re.sub(r"\s*/\s*", "/", s)  # "3 / 4" is a fraction; "4 6" stays two numbers (not 46)
    s = s.rstrip(".")
    frac = re.fullmatch(r"([-+]?)\\[dt]?frac\{(\d+)\}\{(\d+)\}", s)
    if frac:
        sign, num, den = frac.groups()
        s = f"{sign}{num}/{den}"
    percent = s.endswith("%")
    if percent:
        s = s[:-1]
    if not s or len(s) > _MAX_NUMBER_CHARS:
        return None
    if re.fullmatch(r"[-+]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?|[-+]?\.\d+", s):
        value = Fraction(s.replace(",", ""))
    elif re.fullmatch(r"[-+]?\d+/\d+", s):
        num, den = s.split("/")
        if int(den) == 0:
            return None
        value = Fraction(int(num), int(den))
    else:
        return None
    return value / 100 if percent else value


def normalize(text: str) -> str:
    """Lower case, no surrounding spaces, ``$``, trailing period or ``\\text{}`` wrapper."""
    s = text.strip().strip("$").strip().rstrip(".").strip()
    m = re.fullmatch(r"\\text\{(.*)\}", s)
    if m:
        s = m.group(1)
    return " ".join(s.rstrip(".").split()).lower()


def exact_match(pred: str | None, ref: str) -> bool:
    """Same normalised string, or the same number when both sides read as numbers."""
    if pred is None:
        return False
    a, b = parse_number(pred), parse_number(ref)
    if a is not None and b is not None:
        return a == b
    return normalize(pred) == normalize(ref)


def numeric_match(pred: str | None, ref: str, tolerance: float = 1e-6) -> bool:
    """Numbers within ``tolerance`` (absolute, or relative to the reference); False if either is not a number."""
    a, b = parse_number(pred), parse_number(ref)
    if a is None or b is None:
        return False
    return abs(float(a) - float(b)) <= tolerance * max(1.0, abs(float(b)))


def math_match(pred: str | None, ref: str) -> bool:
    """Mathematical equivalence of two answers by math-verify (LaTeX or plain expressions)."""
    if pred is None:
        return False
    import math_verify  # sympy and an ANTLR LaTeX parser: loaded on the first math-scored answer

    def parse(text: str) -> list:
        # math-verify finds LaTeX by its delimiters: a bare "\\sqrt{8}" parses to nothing, "$\\sqrt{8}$" to sqrt(8)
        return math_verify.parse(text if "$" in text else f"${text}$", parsing_timeout=2)

    gold, got = parse(ref), parse(pred)
    if not gold or not got:
        return exact_match(pred, ref)  # nothing math-verify understands: fall back to exact strings/numbers
    return bool(math_verify.verify(gold, got, timeout_seconds=2))


def has_format(text: str, answer_format: str) -> bool:
    """Whether a completion presents its answer in the task's format."""
    if answer_format == "boxed":
        return extract_boxed(text) is not None
    if answer_format == "hash":
        return extract_hash(text) is not None
    return extract_last_number(text) is not None


@dataclass(frozen=True)
class RewardConfig:
    """How completions are scored (every task config inherits these keys)."""

    reward: str = "exact"  # exact: normalised string / equal numbers | numeric: within tolerance | math: math-verify
    extract: str = "auto"  # auto | boxed | tag | hash | last_number | full: where the answer is read
    tolerance: float = 1e-6  # numeric: allowed |pred - ref| / max(1, |ref|)
    format_reward: float = 0.0  # added when the answer is in the task's format (shaping; 0 = off)
    reward_modes: ClassVar[tuple[str, ...]] = REWARD_MODES  # a task with a scorer of its own adds its mode

    def __post_init__(self) -> None:
        if self.reward not in self.reward_modes:
            raise ValueError(f"reward must be one of {', '.join(self.reward_modes)}, got {self.reward!r}")
        if self.extract not in EXTRACT_MODES:
            raise ValueError(f"extract must be one of {', '.join(EXTRACT_MODES)}, got {self.extract!r}")


def score(completion: str, reference: str, cfg: RewardConfig, answer_format: str = "plain") -> Score:
    """Correctness reward (1/0) plus the optional format reward."""
    pred = extract_answer(completion, cfg.extract)
    if cfg.reward == "math":
        correct = math_match(pred, reference)
    elif cfg.reward == "numeric":
        correct = numeric_match(pred, reference, cfg.tolerance)
    else:
        correct = exact_match(pred, reference)
    reward = float(correct)
    if cfg.format_reward and has_format(completion, answer_format):
        reward += cfg.format_reward
    return Score(reward, correct, pred)
