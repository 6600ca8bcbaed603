"""reasoning-gym datasets as text tasks: splits, the dataset's own scorer, bad input, and the CLI."""

from __future__ import annotations

import json

import pytest

from rlinf_cli.api import UserError
from rlinf_sim_reasoning.rgym import ReasoningGymTask
from rlinf_sim_reasoning.tasks import EVAL_SEED_BASE, VALIDATION_SEED_BASE

SMALL = {"task": "chain_sum", "params": {"min_terms": 2, "max_terms": 3, "min_digits": 1, "max_digits": 1}}


def test_held_out_split_is_disjoint_and_eval_questions_distinct():
    task = ReasoningGymTask(SMALL)  # ~4,000 distinct problems: duplicates are common, so distinctness is tested
    held = task.prompts(range(EVAL_SEED_BASE, EVAL_SEED_BASE + 200))
    train = task.prompts(range(3000))
    assert len({s.prompt for s in held}) == 200
    assert not {s.prompt for s in held} & {s.prompt for s in train}
    assert len({s.prompt for s in train}) > 500  # training draws spread over the space, not a few items
    again = ReasoningGymTask(SMALL).prompts([EVAL_SEED_BASE + 7, 11])
    assert [s.prompt for s in again] == [held[7].prompt, train[11].prompt]  # seeds name the same prompts
    val = task.prompts(range(VALIDATION_SEED_BASE, VALIDATION_SEED_BASE + 200))  # eval.best's validation
    assert len({s.prompt for s in val}) > 100 and not {s.prompt for s in val} & {s.prompt for s in held}


def test_scores_with_the_datasets_own_verifier():
    task = ReasoningGymTask({"task": "group_anagrams", "extract": "full"})
    sample = task.prompts([EVAL_SEED_BASE])[0]
    groups = json.loads(sample.answer)
    assert len(groups) > 1
    shuffled = json.dumps(list(reversed(groups)))  # another order of the same groups: a string compare says no
    assert shuffled != sample.answer
    assert task.score(sample, shuffled).correct and task.score(sample, shuffled).reward == 1.0
    assert not task.score(sample, json.dumps(groups[:-1])).correct


def test_partial_credit_is_opt_in():
    # the default scorer gives len(answer)/len(output) when the answer is a substring of the output
    strict = ReasoningGymTask({**SMALL, "extract": "full"})
    lenient = ReasoningGymTask({**SMALL, "extract": "full", "partial_credit": True})
    sample = strict.prompts([EVAL_SEED_BASE + 3])[0]
    noisy = f"{sample.answer} 12345"
    assert strict.score(sample, noisy).reward == 0.0
    got = lenient.score(sample, noisy)
    assert 0.0 < got.reward < 1.0 and not got.correct
    assert strict.score(sample, f"<answer>{sample.answer}</answer>").reward == 0.0  # full: the tag is part of it
    tagged = ReasoningGymTask(SMALL).score(sample, f"thinking... <answer>{sample.answer}</answer>")
    assert tagged.correct and tagged.extracted == sample.answer


def test_other_comparisons_and_scorer_errors(monkeypatch):
    task = ReasoningGymTask({**SMALL, "reward": "numeric"})
    sample = task.prompts([EVAL_SEED_BASE])[0]
    assert task.score(sample, f"The answer is {sample.answer}.0").correct
    gym = ReasoningGymTask(SMALL)

    def broken(answer, entry):
        raise RuntimeError("scorer choked")

    monkeypatch.setattr(gym.dataset, "score_answer", broken)
    assert gym.score(sample, "garbage").reward == 0.0  # a scorer error is a wrong answer, not a crashed run


@pytest.mark.parametrize("cfg, message", [
    ({"task": "chain_sums"}, "no dataset 'chain_sums' (did you mean chain_sum"),
    ({"task": "chain_sum", "params": {"min_terms": 5, "max_terms": 2}}, "sim.params for reasoning-gym 'chain_sum'"),
    ({"task": "chain_sum", "params": {"colour": 3}}, "sim.params for reasoning-gym 'chain_sum'"),
    ({"task": "chain_sum", "reward": "fuzzy"}, "reward must be one of"),
    ({"task": "chain_sum", "template": "no placeholder"}, "template must contain {question}"),
])
def test_bad_settings_are_one_line(cfg, message):
    with pytest.raises(UserError) as err:
        ReasoningGymTask(cfg)
    assert message in str(err.value) and "\n" not in str(err.value)


def test_too_few_held_out_questions_is_one_line():
    task = ReasoningGymTask({"task": "chain_sum", "params": {"min_terms": 2, "max_terms": 2, "min_digits": 1,
                                                             "max_digits": 1}, "holdout": 0.05})
    with pytest.raises(UserError, match="distinct held-out questions"):  # 200 problems exist, ~10 held out
        task.prompts([EVAL_SEED_BASE + 100])


def test_grpo_runs_on_a_reasoning_gym_task_through_the_cli(cli, workdir):
    r = cli("rl", "--algo", "grpo", "sim=reasoning_gym", "sim.task=chain_sum",
            "sim.params={min_terms: 2, max_terms: 2, min_digits: 1, max_digits: 1}", "sim.max_new_tokens=4",
            "model=hf", "model.hidden_size=32", "model.layers=1", "model.heads=2", "model.kv_heads=1",
            "model.intermediate_size=64", "text.iterations=2", "algo.groups=2", "algo.group_size=2",
            "eval.episodes=4", "eval.interval=2", "run_dir=rl", "tracking.enabled=false", "progress=false")
    assert r.code == 0, r.err
    result = json.loads((workdir / "rl/result.json").read_text())
    assert 0.0 <= result["eval"]["accuracy"] <= 1.0
    r = cli("eval", f"checkpoint={result['checkpoint']}", "episodes=4", "tracking.enabled=false", "progress=false")
    assert r.code == 0, r.err  # the task (dataset and params) comes back from the checkpoint
    assert r.json_tail()["accuracy"] == result["eval"]["accuracy"]
