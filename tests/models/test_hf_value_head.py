"""The causal LM's critic (model=hf, critic.py): a value per token, the same when recorded while
sampling as when recomputed in training (single- and multi-turn), trained with LoRA, saved and
loaded with the checkpoint, left out of exports."""

from __future__ import annotations

import pytest
import torch

from rlinf_cli.collectors.text_sampling import sample_completions, to_experience
from rlinf_cli.errors import UserError
from rlinf_cli.policy import load_policy
from rlinf_model_hf import critic
from rlinf_model_hf.model import HFCausalLM
from rlinf_sim_reasoning.tasks import ArithmeticTask

pytestmark = pytest.mark.numerics  # results depend on CPU features: make test-portable runs them again

TINY = {"name": "hf", "hidden_size": 32, "layers": 2, "heads": 2, "kv_heads": 1, "intermediate_size": 64}


def _policy(**options) -> HFCausalLM:
    """A tiny model with a value head that is not zero (a fresh head's zeros would match anywhere)."""
    torch.manual_seed(0)
    policy = HFCausalLM({**TINY, "critic": True, **options})
    with torch.no_grad():
        policy.value_head.linear.weight.normal_(0.0, 1.0)
        policy.value_head.linear.bias.fill_(0.25)
    return policy


class ScriptedToolTask(ArithmeticTask):
    """Arithmetic with up to three model turns: every turn that does not end at eos gets a scripted
    tool result (context, loss mask 0) and the model writes on: tool tokens in the middle."""

    max_turns = 3

    def tool_response(self, sample, transcript: str) -> str | None:
        return f"\n<tool_response>{sample.answer}</tool_response>\n"


def _sampled_vs_trained(policy: HFCausalLM, task, seeds, group_size: int):
    comps = sample_completions(policy, task, task.prompts(seeds), group_size, 5,
                               generator=torch.Generator().manual_seed(1), values=True)
    n = len(comps)
    exp = to_experience(policy, comps, group_size, (1, n))
    with torch.no_grad():
        out = policy.evaluate(exp.obs, exp.actions)
    mask = exp.token_mask.reshape(n, -1)
    return comps, exp, out, mask


def test_values_and_logprobs_recorded_while_sampling_equal_the_training_forward():
    policy = _policy()
    comps, exp, out, mask = _sampled_vs_trained(policy, ArithmeticTask({"digits": 2}), [1, 2, 3], 3)
    assert exp.values.shape == exp.logprobs.shape == exp.token_mask.shape  # [1, N, L]: a value per token
    assert out.value.shape == out.logprob.shape == mask.shape
    on = mask.bool()
    sampled_v, sampled_lp = exp.values.reshape(mask.shape), exp.logprobs.reshape(mask.shape)
    torch.testing.assert_close(out.value[on], sampled_v[on], atol=1e-4, rtol=0)
    torch.testing.assert_close(out.logprob[on], sampled_lp[on], atol=1e-4, rtol=0)
    assert sampled_v[on].std() > 0.1  # a head that reads the hidden state, not a constant


def test_multi_turn_values_skip_tool_tokens_and_match_training():
    policy = _policy()
    comps, exp, out, mask = _sampled_vs_trained(policy, ScriptedToolTask({"digits": 2}), [4, 5, 6, 7], 2)
    # some episodes have tool tokens between two model turns
    middle = [c for c in comps if 0 in c.loss_mask and 1 in c.loss_mask[c.loss_mask.index(0):]]
    assert middle and all(c.turns >= 2 for c in middle)
    for c in comps:
        assert len(c.values) == len(c.tokens) and all(v == 0.0 for v, m in zip(c.values, c.loss_mask) if not m)
    on = mask.bool()
    torch.testing.assert_close(out.value[on], exp.values.reshape(mask.shape)[on], atol=1e-4, rtol=0)
    torch.testing.assert_close(out.logprob[on], exp.logprobs.reshape(mask.shape)[on], atol=1e-4, rtol=0)


def test_add_critic_gives_a_zero_head_that_trains_and_is_declared():
    torch.manual_seed(0)
    policy = HFCausalLM(TINY)
    assert not policy.has_critic and policy.critic_parameters() == []
    assert policy.add_critic() and policy.has_critic and policy.config["critic"] is True
    head = policy.critic_parameters()
    assert {id(p) for p in head} == {id(p) for p in policy.value_head.parameters()} and all(p.requires_grad for p in head)
    assert [n for n, _ in policy.named_parameters()][-2:] == ["value_head.linear.weight", "value_head.linear.bias"]
    comps = sample_completions(policy, ArithmeticTask({"digits": 1}), ArithmeticTask({"digits": 1}).prompts([0]), 2, 4,
                               generator=torch.Generator().manual_seed(0), values=True)
    assert all(v == 0.0 for c in comps for v in c.values)  # zero-initialised: estimates 0 until trained


def test_with_lora_the_head_trains_beside_the_adapter_and_is_saved_with_it(tmp_path):
    from rlinf_cli.algorithm import OptimSpec
    from rlinf_cli.runtime.engine import make_engine
    from rlinf_model_hf import lora

    policy = _policy(lora={"r": 4})
    trainable = {n for n, p in policy.named_parameters() if p.requires_grad}
    assert trainable == {f"lm.{n}" for n in lora.adapter_parameters(policy.lm)} | \
        {"value_head.linear.weight", "value_head.linear.bias"}
    engine = make_engine(policy, OptimSpec(lr=1e-2), {})
    comps, exp, out, mask = _sampled_vs_trained(policy, ArithmeticTask({"digits": 2}), [1, 2], 2)
    before = policy.value_head.linear.weight.detach().clone()
    out = policy.evaluate(exp.obs, exp.actions)
    engine.backward(((out.value - 1.0) ** 2 * mask).sum() - (out.logprob * mask).sum())
    engine.step()
    assert not torch.equal(before, policy.value_head.linear.weight)  # the head trained
    policy.save_pretrained(tmp_path / "ckpt")
    assert (tmp_path / "ckpt" / critic.VALUE_HEAD_FILE).is_file() and (tmp_path / "ckpt" / lora.ADAPTER_DIR).is_dir()
    loaded = load_policy(tmp_path / "ckpt")
    assert loaded.peft is not None and loaded.value_head.linear.weight.requires_grad
    with torch.no_grad():
        a, b = policy.evaluate(exp.obs, exp.actions), loaded.evaluate(exp.obs, exp.actions)
    torch.testing.assert_close(a.value * mask, b.value * mask, atol=1e-6, rtol=0)
    torch.testing.assert_close(a.logprob * mask, b.logprob * mask, atol=1e-6, rtol=0)


def test_checkpoints_keep_the_head_exports_leave_it_out(tmp_path):
    from transformers import AutoModelForCausalLM

    policy = _policy()
    policy.save_pretrained(tmp_path / "ckpt")
    loaded = load_policy(tmp_path / "ckpt")
    assert loaded.has_critic and torch.equal(loaded.value_head.linear.weight, policy.value_head.linear.weight)
    policy.export(tmp_path / "plain")
    assert not list((tmp_path / "plain").glob("value_head*"))
    assert AutoModelForCausalLM.from_pretrained(tmp_path / "plain").config.hidden_size == 32  # plain transformers
    (tmp_path / "ckpt" / critic.VALUE_HEAD_FILE).unlink()
    with pytest.raises(UserError, match="has no value_head.safetensors; the checkpoint is damaged"):
        load_policy(tmp_path / "ckpt")
