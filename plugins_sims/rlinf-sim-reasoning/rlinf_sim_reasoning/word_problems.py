"""Arithmetic word problems with 3-4 digit numbers: where a tool call beats mental arithmetic.

Each problem is a short sentence or two around a product, a sum, a difference or a mix, e.g.
"A warehouse has 347 shelves with 2856 screws on each. How many screws are there in all?".
The prompts do not depend on the tools, so ``sim.tools=[]`` is the control run of
``sim.tools=[calculator]`` or ``sim.tools=[python]`` on exactly the same problems.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

from rlinf_cli.api import TextSample, settings
from rlinf_sim_reasoning.tasks import held_out, held_out_seed
from rlinf_sim_reasoning.tool_tasks import ToolTask, ToolTaskConfig

Problem = tuple[str, str, int]  # (question, expression, answer)


def _product(n: Callable[[], int], rng: random.Random) -> Problem:
    a, b = n(), n()
    thing, box = rng.choice((("screws", "shelves"), ("apples", "crates"), ("pages", "books"), ("seats", "rows")))
    return f"There are {a} {box} with {b} {thing} in each. How many {thing} are there in all?", f"{a}*{b}", a * b


def _sum(n: Callable[[], int], rng: random.Random) -> Problem:
    a, b, c = n(), n(), n()
    thing = rng.choice(("books", "tickets", "coins", "bricks"))
    return (f"A store had {a} {thing}, got {b} more on Monday and {c} more on Tuesday. How many {thing} does it "
            f"have now?", f"{a}+{b}+{c}", a + b + c)


def _difference(n: Callable[[], int], rng: random.Random) -> Problem:
    a, b = sorted((n(), n()), reverse=True)
    thing = rng.choice(("liters of water", "kilograms of rice", "meters of cable"))
    return f"A depot held {a} {thing} and {b} were taken out. How many are left?", f"{a}-{b}", a - b


def _mixed(n: Callable[[], int], rng: random.Random) -> Problem:
    a, b, c = n(), n(), n()
    thing = rng.choice(("shirts", "lamps", "chairs"))
    return (f"A shop sold {a} {thing} at {b} dollars each and had {c} dollars of other sales. How many dollars "
            f"did it take in?", f"{a}*{b}+{c}", a * b + c)


KINDS: dict[str, Callable[[Callable[[], int], random.Random], Problem]] = {
    "product": _product, "sum": _sum, "difference": _difference, "mixed": _mixed}


@dataclass(frozen=True)
class WordProblemsConfig(ToolTaskConfig):
    min_digits: int = 3  # fewest digits per number
    digits: int = 4  # most digits per number
    kinds: tuple[str, ...] = ("product", "sum", "difference", "mixed")  # problem shapes drawn
    template: str = "{question} End with #### and the number.\n"  # prompt text around the problem

    def __post_init__(self) -> None:
        super().__post_init__()
        if not 1 <= self.min_digits <= self.digits <= 12:
            raise ValueError("need 1 <= min_digits <= digits <= 12")
        if not self.kinds or set(self.kinds) - set(KINDS):
            raise ValueError(f"kinds must be a non-empty subset of {', '.join(KINDS)}")
        if "{question}" not in self.template:
            raise ValueError("template must contain {question}")


class WordProblemsTask(ToolTask):
    """Multi-digit arithmetic in words; a tool (``sim.tools``) computes it exactly."""

    def __init__(self, cfg: Mapping[str, Any]):
        super().__init__(settings.build(WordProblemsConfig, cfg, "sim"))

    def problem(self, rng: random.Random) -> Problem:
        c = self.cfg

        def number() -> int:
            d = rng.randint(c.min_digits, c.digits)
            return rng.randint(10 ** (d - 1) if d > 1 else 0, 10 ** d - 1)

        return KINDS[rng.choice(c.kinds)](number, rng)

    def prompts(self, seeds: Sequence[int]) -> list[TextSample]:
        out = []
        for seed in seeds:
            rng = random.Random(seed)
            for _ in range(10_000):  # the split decides which problems a seed may draw
                question, expression, value = self.problem(rng)
                if held_out(question, self.cfg.holdout) == held_out_seed(seed):
                    break
            answer = str(value)
            out.append(TextSample(self.cfg.template.format(question=question), answer,
                                  self.reference(expression, answer), int(seed)))
        return out
