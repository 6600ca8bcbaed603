"""Multi-turn tool use through the same rollout path as single-turn tasks: tool calls parsed from
the model's turns, results appended as context, and in the Experience a loss mask that is exactly
the tokens the policy wrote."""

from __future__ import annotations

import pytest
import torch

from rlinf_cli.collectors.text_sampling import episode_metrics, sample_completions, to_experience
from rlinf_cli.collectors.text_tools import Toolbox
from rlinf_cli.toolcalls import CALL_CLOSE, RESULT_OPEN, format_call
from rlinf_sim_reasoning.tool_tasks import CalculatorTask
from rlinf_tools.calculator import Calculator

EOS, PAD, BOS = 0, 1, 2


class ScriptedPolicy:
    """A text policy over character codes that plays a script per question: turn k of an episode
    (k = tool results seen so far) writes ``script[question][k]``. It records every token it
    writes, so a test knows exactly which tokens are the policy's."""

    eos_token_id, pad_token_id, device = EOS, PAD, torch.device("cpu")

    def __init__(self, script, render_results: bool = True):
        self.script = script
        self.written: list[tuple[tuple[int, ...], list[int]]] = []  # (context, the tokens written after it)
        if not render_results:  # a policy without its own tool-message rendering: the core's fallback text
            self.encode_tool_result = None

    def encode_prompts(self, prompts, tools=None):
        self.tools_seen = tools
        return [[BOS] + [ord(ch) for ch in p] for p in prompts]

    def encode_text(self, text):
        return [ord(ch) for ch in text]

    def encode_tool_result(self, name, content, after_eos=False):  # a template-like tool turn
        return self.encode_text(f"[end]\n[tool {name}]{content}[/tool]\n[assistant]")

    def decode(self, ids):
        return "".join(chr(i) for i in ids if i > BOS)

    def generate(self, prompts, *, samples, max_new_tokens, greedy=False, stop=(), generator=None):
        from rlinf_model_hf.sampling import Generation

        rows = []
        for p in prompts:
            text = self.decode(p)
            question = text.split("What is ", 1)[1].split("?", 1)[0]
            turn = self.script[question][min(text.count("[tool ") + text.count(RESULT_OPEN), len(self.script[question]) - 1)]
            ids = self.encode_text(turn) + ([] if turn.endswith(CALL_CLOSE) else [EOS])
            for _ in range(samples):
                rows.append(ids[:max_new_tokens])
                self.written.append((tuple(p), rows[-1]))
        width = max(len(r) for r in rows)
        tokens = torch.full((len(rows), width), PAD)
        for i, r in enumerate(rows):
            tokens[i, :len(r)] = torch.tensor(r)
        finish = ["eos" if r and r[-1] == EOS else "stop" if len(r) < max_new_tokens else "length" for r in rows]
        return Generation(tokens, torch.full(tokens.shape, -0.5), torch.tensor([len(r) for r in rows]), finish)


def policy_positions(policy: ScriptedPolicy, c) -> set[int]:
    """Positions in ``c.tokens`` that the policy wrote: after a context that is this episode's own
    prefix, the tokens it wrote there."""
    full, start = c.prompt_ids + c.tokens, len(c.prompt_ids)
    out: set[int] = set()
    for ctx, wrote in policy.written:
        k = len(ctx)
        if tuple(full[:k]) == ctx and full[k:k + len(wrote)] == wrote:
            out |= set(range(k - start, k - start + len(wrote)))
    return out


def calc(expr: str) -> str:
    return format_call("calculator", {"expression": expr})


def script_for(task, seeds):
    """Per question: a good call then the answer; a malformed call, an unknown tool, then an answer;
    or the answer straight away."""
    samples = task.prompts(seeds)
    script = {}
    for i, s in enumerate(samples):
        q = s.prompt.split("What is ", 1)[1].split("?")[0]
        script[q] = [[calc(q), f"#### {s.answer}"],
                     ["<tool_call>{oops}" + CALL_CLOSE, format_call("abacus", {}), f"#### {s.answer}"],
                     [f"#### {s.answer}"]][i % 3]
    return samples, script


@pytest.mark.parametrize("render_results", [True, False])
def test_the_loss_mask_is_exactly_what_the_policy_wrote(render_results):
    task = CalculatorTask({"digits": 3, "min_digits": 3, "max_turns": 4})
    samples, script = script_for(task, [11, 12, 13])
    policy = ScriptedPolicy(script, render_results)
    comps = sample_completions(policy, task, samples, 2, task.max_new_tokens, tools=Toolbox([Calculator()]))
    assert [c.turns for c in comps] == [2, 2, 3, 3, 1, 1] and [c.tool_calls for c in comps] == [1, 1, 2, 2, 0, 0]
    assert [c.tool_errors for c in comps[2:4]] == [["malformed", "unknown_tool"]] * 2
    for c in comps:
        assert c.score.correct and c.finish == "eos"
    q = samples[0].prompt.split("What is ", 1)[1].split("?")[0]
    shown = f"[end]\n[tool calculator]{samples[0].answer}[/tool]\n[assistant]" if render_results \
        else f"\n{RESULT_OPEN}{samples[0].answer}</tool_response>\n"
    assert comps[0].text == calc(q) + shown + f"#### {samples[0].answer}"
    assert "error: the call is not valid JSON" in comps[2].text and "error: unknown tool 'abacus'" in comps[2].text

    exp = to_experience(policy, comps, 2, (1, 6))
    ids, attn, mask = exp.actions["ids"], exp.actions["attn"], exp.token_mask.reshape(6, -1)
    logp = exp.logprobs.reshape(6, -1)
    for i, c in enumerate(comps):
        wrote = policy_positions(policy, c)
        row = ids[i][attn[i].bool()].tolist()
        assert row == c.tokens and {j for j in range(len(row)) if mask[i][j] == 1} == wrote  # exactly the policy's
        assert mask[i][len(row):].sum() == 0 and (len(wrote) < len(row)) == bool(c.tool_calls)
        assert torch.all(logp[i][mask[i] == 0] == 0) and torch.all(logp[i][mask[i] == 1] == -0.5)
        tool_text = policy.decode([t for j, t in enumerate(row) if j not in wrote])
        assert tool_text.count("[/tool]" if render_results else "</tool_response>") == c.tool_calls  # results only
    assert exp.obs["prompt_ids"].shape[0] == 3  # one prompt row per group, as sampled


def test_turn_and_token_caps():
    task = CalculatorTask({"digits": 2, "min_digits": 2, "max_turns": 3})
    samples = task.prompts([5])
    q = samples[0].prompt.split("What is ", 1)[1].split("?")[0]
    policy = ScriptedPolicy({q: [calc(q)] * 10})  # calls forever
    (c,) = sample_completions(policy, task, samples, 1, task.max_new_tokens, tools=Toolbox([Calculator()]))
    assert c.turns == 3 and c.tool_calls == 2 and c.finish == "stop"  # the third turn's call is never run
    capped = CalculatorTask({"digits": 2, "min_digits": 2, "max_turns": 3, "max_episode_tokens": 100})
    (c,) = sample_completions(ScriptedPolicy({q: [calc(q)] * 10}), capped, samples, 1, task.max_new_tokens,
                              tools=Toolbox([Calculator()]))
    assert len(c.tokens) == len(c.loss_mask) == len(c.logprobs) == 100 and c.finish == "length"


def test_episode_metrics():
    task = CalculatorTask({"digits": 3, "min_digits": 3, "max_turns": 4})
    samples, script = script_for(task, [11, 12, 13])
    comps = sample_completions(ScriptedPolicy(script), task, samples, 2, task.max_new_tokens,
                               tools=Toolbox([Calculator()]))
    m = episode_metrics(comps, True)
    assert m["rollout/tool_calls_mean"] == pytest.approx(6 / 6) and m["rollout/tool_errors"] == 4.0
    assert m["rollout/tool_call_success"] == pytest.approx(2 / 6)  # 2 of 6 calls returned a result
    assert m["rollout/tool_errors/malformed"] == 2.0 and m["rollout/tool_errors/unknown_tool"] == 2.0
    assert m["rollout/turns_mean"] == pytest.approx(12 / 6)
    assert set(episode_metrics(comps, False)) == {"rollout/turns_mean"}


def test_tool_use_with_a_language_model():
    from rlinf_model_hf.model import HFCausalLM

    torch.manual_seed(0)
    policy = HFCausalLM({"name": "hf", "hidden_size": 32, "layers": 1, "heads": 2, "kv_heads": 1, "intermediate_size": 64})
    task = CalculatorTask({"max_new_tokens": 12})
    tools = Toolbox.for_task(task)
    comps = sample_completions(policy, task, task.prompts([1, 2]), 2, task.max_new_tokens,
                               generator=torch.Generator().manual_seed(0), tools=tools)
    for c in comps:  # an untrained model rarely calls the tool; the episode still runs and is scored
        assert len(c.tokens) == len(c.loss_mask) == len(c.logprobs) and 1 <= c.turns <= task.max_turns
        assert c.score is not None and c.score.reward in (0.0, 1.0)
        assert policy.decode(c.prompt_ids).startswith("Tools (call one as <tool_call>")  # described in the prompt
    exp = to_experience(policy, comps, 2, (1, 4))
    assert exp.token_mask.sum() == sum(sum(c.loss_mask) for c in comps)


def test_sft_on_tool_transcripts_describes_the_tools_and_masks_the_results(tmp_path):
    from types import SimpleNamespace

    from rlinf_cli.collectors.datasets import TextDataset
    from rlinf_cli.collectors.text_record import TextRecorder

    task = CalculatorTask({})
    recorder = TextRecorder(task, None, SimpleNamespace(seed=0), tools=Toolbox([Calculator()]))
    writer = recorder.writer(str(tmp_path / "calc.jsonl"), {"policy": "expert"}, 0)
    for s in task.prompts(range(4)):
        writer.add({"prompt": s.prompt, "completion": s.solution, "answer": s.answer, "seed": s.seed})
    writer.close()
    text = SimpleNamespace(prompt_key="prompt", completion_key="completion", max_length=1024, packing=False)
    data = TextDataset(str(tmp_path / "calc.jsonl"), 0.0, 0, "cpu", text)
    policy = ScriptedPolicy({})
    data.prepare(policy, print)
    assert [t["function"]["name"] for t in data.tools] == ["calculator"] and policy.tools_seen == data.tools
    for row, mask, s in zip(data.rows, data.masks, task.prompts(range(4))):
        q = s.prompt.split("What is ", 1)[1].split("?")[0]
        trained = policy.decode([t for t, m in zip(row, mask) if m]) + ("<eos>" if row[-1] == EOS and mask[-1] else "")
        assert trained == f"{calc(q)}#### {s.answer}<eos>"  # the call and the answer, never the tool's result
        context = policy.decode([t for t, m in zip(row, mask) if not m])
        assert context.endswith(f"What is {q}?\n[end]\n[tool calculator]{s.answer}[/tool]\n[assistant]")  # rendered
