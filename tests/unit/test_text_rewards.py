"""Reward functions on tricky strings, the calculator tool's parser (never eval), and the tool tasks'
reference transcripts."""

from __future__ import annotations

import re
from fractions import Fraction

import pytest

from rlinf_cli.api import TextSample
from rlinf_cli.errors import UserError
from rlinf_sim_reasoning import rewards
from rlinf_sim_reasoning.tasks import EVAL_SEED_BASE, VALIDATION_SEED_BASE, ArithmeticTask, JsonlTask
from rlinf_sim_reasoning.tool_tasks import CalculatorTask
from rlinf_sim_reasoning.word_problems import WordProblemsTask
from rlinf_tools.calculator import CalcError, calculate


@pytest.mark.parametrize("text, mode, expected", [
    ("so \\boxed{\\frac{1}{2}} done", "boxed", "\\frac{1}{2}"),
    ("\\boxed{a} then \\boxed{{b}+c}", "boxed", "{b}+c"),
    ("\\boxed{12", "boxed", None),  # unbalanced: the model stopped mid-answer
    ("Natalia sold 48/2 = 24 clips.\n#### 72", "hash", "72"),
    ("#### 1,234\nextra", "hash", "1,234"),
    ("####   ", "hash", None),
    ("12 apples and 13 pears", "last_number", "13"),
    ("version v2 costs -7.5 dollars", "last_number", "-7.5"),
    ("The answer is 42.", "auto", "42"),
    ("\\boxed{7} but #### 8", "auto", "7"),
    ("no digits here", "auto", None),
    ("  46 ", "full", "46"),
])
def test_extraction(text, mode, expected):
    assert rewards.extract_answer(text, mode) == expected


@pytest.mark.parametrize("text, value", [
    ("1,234", Fraction(1234)), ("$12", Fraction(12)), ("-0.50", Fraction(-1, 2)), ("3/4", Fraction(3, 4)),
    ("\\frac{3}{4}", Fraction(3, 4)), ("50%", Fraction(1, 2)), ("\u22125", Fraction(-5)), ("7.", Fraction(7)),
    ("1/0", None), ("12a", None), ("__import__('os')", None), ("9" * 100, None), ("", None), ("1,23", None),
])
def test_parse_number(text, value):
    assert rewards.parse_number(text) == value


def test_exact_and_numeric_match():
    assert rewards.exact_match("0.5", "1/2")
    assert rewards.exact_match("072", "72")  # numbers compare as numbers
    assert rewards.exact_match(" \\text{Paris}. ", "paris")
    assert not rewards.exact_match("7", "72")
    assert not rewards.exact_match(None, "1")
    assert rewards.numeric_match("3.1415927", "3.14159265", 1e-6)
    assert not rewards.numeric_match("3.15", "3.14159265", 1e-6)
    assert not rewards.numeric_match("pi", "3.14", 1e-6)


def test_score_with_format_reward():
    cfg = rewards.RewardConfig(reward="numeric", extract="auto", format_reward=0.1)
    s = rewards.score("work... #### 72", "72", cfg, "hash")
    assert s.correct and s.reward == pytest.approx(1.1) and s.extracted == "72"
    s = rewards.score("it is 72", "72", cfg, "hash")
    assert s.correct and s.reward == pytest.approx(1.0)  # right, but not in the #### format
    s = rewards.score("#### 71", "72", cfg, "hash")
    assert not s.correct and s.reward == pytest.approx(0.1)


def test_arithmetic_exact_match_is_strict():
    task = ArithmeticTask({"digits": 2, "min_digits": 2})
    sample = TextSample("12+34=", "46", "46", 0)
    assert task.score(sample, "46").correct
    assert not task.score(sample, "46 7").correct  # trailing junk is not an exact match
    assert not task.score(sample, "4 6").correct


def test_arithmetic_seeds_are_deterministic_and_held_out():
    task = ArithmeticTask({"digits": 2, "terms": 2, "ops": "+-*"})
    assert task.prompts([5, 6]) == task.prompts([5, 6])
    train = {s.prompt for s in task.prompts(range(3000))}
    held = {s.prompt for s in task.prompts(range(EVAL_SEED_BASE, EVAL_SEED_BASE + 300))}
    assert train and held and not train & held
    for s in task.prompts(range(50)):  # answers are right (checked with the calculator, not eval)
        assert Fraction(s.answer) == calculate(s.prompt.rstrip("="))
    # eval.best's validation seeds (2,000,000 on) draw training-split problems: none the final evaluation scores
    val = {s.prompt for s in task.prompts(range(VALIDATION_SEED_BASE, VALIDATION_SEED_BASE + 300))}
    assert len(val) > 250 and not val & held and not val & {s.prompt for s in task.prompts(range(EVAL_SEED_BASE, EVAL_SEED_BASE + 3000))}


def test_jsonl_task(tmp_path):
    path = tmp_path / "gsm.jsonl"
    path.write_text('{"question": "2+2?", "answer": "2 and 2 make 4\\n#### 4"}\n\n'
                    '{"question": "3*3?", "answer": "\\\\boxed{9}"}\n')
    task = JsonlTask({"path": str(path), "holdout": 0.5})
    samples = task.prompts(list(range(4))) + task.prompts([EVAL_SEED_BASE])
    answers = {s.prompt.strip(): s.answer for s in samples}
    assert answers["2+2?"] == "4" and answers.get("3*3?", "9") == "9"
    s = next(x for x in samples if x.answer == "4")
    assert s.solution.endswith("#### 4") and task.score(s, "so #### 4.0").correct


def test_jsonl_validation_seeds_never_draw_held_out_rows(tmp_path):
    path = tmp_path / "qa.jsonl"
    path.write_text("".join(f'{{"question": "q{i}", "answer": "#### {i}"}}\n' for i in range(60)))
    task = JsonlTask({"path": str(path), "holdout": 0.25})
    held = {s.prompt for s in task.prompts(range(EVAL_SEED_BASE, EVAL_SEED_BASE + 60))}
    train = {s.prompt for s in task.prompts(range(200))}
    val = {s.prompt for s in task.prompts(range(VALIDATION_SEED_BASE, VALIDATION_SEED_BASE + 60))}
    assert held and train and not held & train
    assert val and val <= train  # a file's held-out rows are the final evaluation's alone


def test_jsonl_errors(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"question": "x"}\n')
    with pytest.raises(UserError, match="needs fields 'question' and 'answer'"):
        JsonlTask({"path": str(bad)})
    with pytest.raises(UserError, match="does not exist"):
        JsonlTask({"path": str(tmp_path / "missing.jsonl")})


@pytest.mark.parametrize("expr, value", [
    ("12*34", Fraction(408)), ("2+3*4", Fraction(14)), ("(2+3)*4", Fraction(20)), ("-3--2", Fraction(-1)),
    ("7/2", Fraction(7, 2)), (" 1 + 2 ", Fraction(3)),
])
def test_calculator(expr, value):
    assert calculate(expr) == value


@pytest.mark.parametrize("expr", ["__import__('os').system('x')", "2**100000", "1/0", "(1+2", "1+", "", "9" * 40,
                                  "1" + "+1" * 60, "abs(-1)"])
def test_calculator_refuses(expr):
    with pytest.raises(CalcError):
        calculate(expr)


def test_calculator_task_transcript_in_the_tool_call_format():
    task = CalculatorTask({})
    sample = task.prompts([3])[0]
    q = sample.prompt.split("What is ", 1)[1].split("?")[0]
    assert sample.solution == (f'<tool_call>{{"name": "calculator", "arguments": {{"expression": "{q}"}}}}</tool_call>'
                               f"\n<tool_response>{sample.answer}</tool_response>\n#### {sample.answer}")
    assert task.tools == ("calculator",) and task.stop == () and task.tool_response(sample, sample.solution) is None
    assert task.score(sample, sample.solution).correct


@pytest.mark.parametrize("text, mode, expected", [
    ("think <answer> 42 </answer>", "tag", "42"),
    ("<answer>1</answer> no, <answer>2</answer>", "tag", "2"),
    ("<answer></answer>", "tag", None),
    ("<answer>7", "tag", None),  # unclosed: the model stopped mid-answer
    ("so <answer>9</answer> and 10", "auto", "9"),  # auto reads a tag before the last number
])
def test_answer_tag_extraction(text, mode, expected):
    assert rewards.extract_answer(text, mode) == expected


@pytest.mark.parametrize("pred, ref, same", [
    ("\\frac{1}{2}", "0.5", True), ("2\\sqrt{2}", "\\sqrt{8}", True), ("x+1", "1+x", True),
    ("(1,2]", "(1, 2]", True), ("1,234", "1234", True), ("3", "4", False), ("x+2", "x+1", False),
    ("(1,2)", "(1, 2]", False), (None, "1", False),
])
def test_math_verify_equivalence(pred, ref, same):
    assert rewards.math_match(pred, ref) is same


def test_jsonl_math_reward(tmp_path):
    path = tmp_path / "math.jsonl"
    path.write_text('{"question": "Half of one?", "answer": "\\\\frac{1}{2}"}\n')
    task = JsonlTask({"path": str(path), "reward": "math", "answer_format": "boxed"})
    sample = task.prompts([0])[0]
    assert task.score(sample, "It is \\boxed{0.5}").correct
    assert not task.score(sample, "It is \\boxed{0.25}").correct


def test_tool_reward_needs_a_well_formed_call_to_a_task_tool():
    task = CalculatorTask({"tool_reward": 0.5})
    sample = task.prompts([3])[0]
    assert task.score(sample, sample.solution).reward == 1.5
    assert task.score(sample, f"#### {sample.answer}").reward == 1.0
    bad = f'<tool_call>{{"name": "python", "arguments": {{}}}}</tool_call>#### {sample.answer}'  # not its tool
    assert task.score(sample, bad).reward == 1.0
    assert task.score(sample, "<tool_call>{nope}</tool_call>#### 1").reward == 0.0


@pytest.mark.parametrize("tools, call", [(["calculator"], '"calculator", "arguments": {"expression": '),
                                         (["python"], '"python", "arguments": {"code": "print('), ([], None)])
def test_word_problems_same_prompts_whatever_the_tools(tools, call):
    base = WordProblemsTask({}).prompts(range(20))
    task = WordProblemsTask({"tools": tools})
    samples = task.prompts(range(20))
    assert [s.prompt for s in samples] == [s.prompt for s in base]  # the control sees the same problems
    for s in samples:
        assert task.score(s, s.solution).correct and s.solution.endswith(f"#### {s.answer}")
        assert (call in s.solution) if call else "<tool_call>" not in s.solution
    assert all(len(n) in (3, 4) for s in samples for n in re.findall(r"\d+", s.prompt))
    assert {s.prompt.split()[0] for s in samples} >= {"There", "A"}  # several problem shapes


def test_word_problems_answers_are_right_and_split():
    task = WordProblemsTask({})
    for s in task.prompts(range(50)):
        expr = s.solution.split('"expression": "', 1)[1].split('"', 1)[0]
        assert calculate(expr) == int(s.answer)
    train = {s.prompt for s in task.prompts(range(300))}
    assert not train & {s.prompt for s in task.prompts(range(EVAL_SEED_BASE, EVAL_SEED_BASE + 50))}
    with pytest.raises(UserError, match="with tools, max_turns must be >= 2"):
        WordProblemsTask({"max_turns": 1})
    WordProblemsTask({"max_turns": 1, "tools": []})  # the control may be single-turn
