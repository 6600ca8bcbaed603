"""Multi-turn tool use: tasks whose model may call tool plugins (``sim.tools``) before answering.

The tools themselves are plugins (kind ``tool``, e.g. rlinf-tools' ``calculator``, ``python``,
``search``); a task only names them and scores the final answer. The core runs the episode:
it describes the tools in the prompt, stops a turn at a call, runs the tool and appends its
result as context (docs/llm.md, "Multi-turn tool use"). A good episode of ``sim=calculator`` on
a model without a tool-aware chat template reads::

    What is 123*45?                                                            <- prompt
    <tool_call>{"name": "calculator", "arguments": {"expression": "123*45"}}</tool_call>
    <tool_response>5535</tool_response>                                       <- the tool's result
    #### 5535                                                                  <- the answer, scored
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

from rlinf_cli.api import Score, TextSample, settings, toolcalls
from rlinf_sim_reasoning import rewards
from rlinf_sim_reasoning.tasks import SingleTurnTask, evaluate_terms, held_out, held_out_seed


@dataclass(frozen=True)
class ToolTaskConfig(rewards.RewardConfig):
    tools: tuple[str, ...] = ("calculator",)  # tool plugins the model may call; () = tools disabled
    tool_options: dict[str, Any] = field(default_factory=dict)  # per tool: options over its conf/tool/<name>.yaml
    max_turns: int = 3  # model turns per episode (tool calls + the final answer)
    max_new_tokens: int = 96  # tokens per model turn (a call is ~85 characters)
    max_episode_tokens: int | None = None  # tokens after the prompt, turns and tool results together; null = no cap
    tool_reward: float = 0.0  # added when the episode made a well-formed call to one of its tools
    answer_format: str = "hash"  # the final answer is written "#### x"
    reward: str = "numeric"
    extract: str = "hash"
    holdout: float = 0.1  # fraction of problems reserved for evaluation seeds

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.max_turns < 1 or self.max_new_tokens < 1:
            raise ValueError("max_turns and max_new_tokens must be >= 1")
        if self.max_episode_tokens is not None and self.max_episode_tokens < 1:
            raise ValueError("max_episode_tokens must be >= 1 or null")
        if self.tools and self.max_turns < 2:
            raise ValueError("with tools, max_turns must be >= 2 (a call and the answer after its result)")


class ToolTask(SingleTurnTask):
    """Shared plumbing: the tools, the turn and token caps, reference transcripts and the tool reward."""

    def __init__(self, cfg: Any):
        super().__init__(cfg)
        self.tools = tuple(cfg.tools)
        self.tool_options = dict(cfg.tool_options)
        self.max_turns = int(cfg.max_turns)
        self.max_episode_tokens = cfg.max_episode_tokens

    def reference(self, expression: str, answer: str) -> str:
        """A reference completion: one call of the first tool that computes ``expression`` (the
        result in the fallback format), then the answer; without such a tool, the answer alone."""
        final = f"#### {answer}"
        for tool in self.tools:
            if tool == "calculator":
                return toolcalls.format_call(tool, {"expression": expression}) + toolcalls.result_text(answer) + final
            if tool == "python":
                return (toolcalls.format_call(tool, {"code": f"print({expression})"})
                        + toolcalls.result_text(f"{answer}\n") + final)
        return final

    def called_a_tool(self, completion: str) -> bool:
        """A well-formed call (JSON naming one of this task's tools) appears in the completion."""
        for part in completion.split(toolcalls.CALL_OPEN)[1:]:
            call = toolcalls.parse_call(toolcalls.CALL_OPEN + part)
            if call is not None and call.error is None and call.name in self.tools:
                return True
        return False

    def score(self, sample: TextSample, completion: str) -> Score:
        s = super().score(sample, completion)
        if self.cfg.tool_reward and self.called_a_tool(completion):
            return Score(s.reward + self.cfg.tool_reward, s.correct, s.extracted)
        return s


@dataclass(frozen=True)
class CalculatorConfig(ToolTaskConfig):
    min_digits: int = 2  # fewest digits per operand
    digits: int = 3  # most digits per operand
    terms: int = 2  # operands per problem
    ops: str = "*"  # operators to draw from, any of "+-*"
    template: str = "What is {question}?\n"  # prompt text

    def __post_init__(self) -> None:
        super().__post_init__()
        if not 1 <= self.min_digits <= self.digits <= 12 or self.terms < 2 or not self.ops or set(self.ops) - set("+-*"):
            raise ValueError("need 1 <= min_digits <= digits <= 12, terms >= 2 and ops a subset of '+-*'")


class CalculatorTask(ToolTask):
    """Arithmetic too hard to do in one's head, with a calculator (or python) one call away."""

    def __init__(self, cfg: Mapping[str, Any]):
        super().__init__(settings.build(CalculatorConfig, cfg, "sim"))

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
                if held_out(question, c.holdout) == held_out_seed(seed):
                    break
            answer = str(evaluate_terms(nums, ops))
            out.append(TextSample(c.template.format(question=question), answer, self.reference(question, answer),
                                  int(seed)))
        return out
