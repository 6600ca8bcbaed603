"""The multi-turn tool-use task runs through the same rollout path as single-turn tasks."""

from __future__ import annotations

import torch

from rlinf_cli.collectors.text_sampling import sample_completions, to_experience  # noqa: E402
from rlinf_sim_reasoning.tools import CalculatorTask  # noqa: E402


class ScriptedPolicy:
    """A text policy over character codes that calls the calculator, then answers from its result."""

    eos_token_id, pad_token_id, device = 0, 1, torch.device("cpu")

    def encode_prompts(self, prompts):
        return [[2] + [ord(ch) for ch in p] for p in prompts]

    def encode_text(self, text):
        return [ord(ch) for ch in text]

    def decode(self, ids):
        return "".join(chr(i) for i in ids if i > 2)

    def generate(self, prompts, *, samples, max_new_tokens, greedy=False, stop=(), generator=None):
        from rlinf_model_hf.sampling import Generation

        rows = []
        for p in prompts:
            text = self.decode(p)
            question = text.split("What is ", 1)[1].split("?", 1)[0]
            if "<result>" not in text:
                rows += [self.encode_text(f"<calc>{question}</calc>")] * samples
            else:
                value = text.rsplit("<result>", 1)[1].split("</result>", 1)[0]
                rows += [self.encode_text(f"#### {value}") + [self.eos_token_id]] * samples
        width = max(len(r) for r in rows)
        tokens = torch.full((len(rows), width), self.pad_token_id)
        for i, r in enumerate(rows):
            tokens[i, :len(r)] = torch.tensor(r)
        finish = ["eos" if r[-1] == self.eos_token_id else "stop" for r in rows]
        return Generation(tokens, torch.full(tokens.shape, -0.5), torch.tensor([len(r) for r in rows]), finish)


def test_tool_call_episode():
    task = CalculatorTask({"digits": 3, "min_digits": 3})
    samples = task.prompts([11, 12])
    comps = sample_completions(ScriptedPolicy(), task, samples, 2, task.max_new_tokens)
    assert len(comps) == 4
    for c in comps:
        assert c.turns == 2 and c.finish == "eos"
        assert c.text == c.sample.solution  # call, tool result, final answer
        assert c.score.correct and c.score.reward == 1.0
        result = task.result_text(c.sample.prompt.split("What is ", 1)[1].split("?")[0])
        start = c.text.index("<result>")
        # the tool's output is context, not policy output: no loss and no log-prob on its tokens
        assert c.loss_mask[start:start + len(result)] == [0] * len(result)
        assert all(m == 1 for m in c.loss_mask[:start]) and c.loss_mask[-1] == 1
        assert c.logprobs[start] == 0.0 and c.logprobs[0] == -0.5
    exp = to_experience(ScriptedPolicy(), comps, 2, (1, 4))
    assert exp.actions["ids"].shape[0] == 4 and exp.token_mask.sum() < exp.actions["attn"].sum()


def test_tool_use_with_a_language_model():
    from rlinf_model_hf.model import HFCausalLM

    torch.manual_seed(0)
    policy = HFCausalLM({"name": "hf", "hidden_size": 32, "layers": 1, "heads": 2, "kv_heads": 1, "intermediate_size": 64})
    task = CalculatorTask({"max_new_tokens": 12})
    comps = sample_completions(policy, task, task.prompts([1, 2]), 2, task.max_new_tokens,
                               generator=torch.Generator().manual_seed(0))
    for c in comps:  # an untrained model rarely calls the tool; the episode still runs and is scored
        assert len(c.tokens) == len(c.loss_mask) == len(c.logprobs) and 1 <= c.turns <= task.max_turns
        assert c.score is not None and c.score.reward in (0.0, 1.0)
