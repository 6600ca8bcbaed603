"""Training with gradient checkpointing (model.gradient_checkpointing=true): transformers turns the
KV cache off in a checkpointed training forward, so the shared-prompt path has no cache to repeat;
the model scores each completion after its own copy of the prompt instead. Same log-probs, entropy,
values and gradients as the cached path (to float tolerance), for LoRA and full fine-tuning."""

from __future__ import annotations

import pytest
import torch

from rlinf_model_hf import sampling
from rlinf_model_hf.model import HFCausalLM
from rlinf_model_hf.sampling import left_pad

pytestmark = pytest.mark.numerics

TINY = {"name": "hf", "hidden_size": 32, "layers": 2, "heads": 2, "kv_heads": 1, "intermediate_size": 64}


def _pair(**extra) -> tuple[HFCausalLM, HFCausalLM]:
    torch.manual_seed(0)
    plain = HFCausalLM({**TINY, **extra})
    torch.manual_seed(0)
    ckpt = HFCausalLM({**TINY, **extra, "gradient_checkpointing": True})
    ckpt.load_state_dict(plain.state_dict())
    return plain, ckpt


def _batch(policy: HFCausalLM) -> tuple[dict, dict]:
    prompts = policy.encode_prompts(["12+3=", "4+45=", "7="])  # three lengths: left padding matters
    gen = policy.generate(prompts, samples=3, max_new_tokens=6, generator=torch.Generator().manual_seed(3))
    ids, mask = left_pad(prompts, policy.pad_token_id, "cpu")
    attn = (torch.arange(gen.tokens.shape[1])[None] < gen.lengths[:, None]).long()
    return {"prompt_ids": ids, "prompt_mask": mask}, {"ids": gen.tokens, "attn": attn}


@pytest.mark.parametrize("extra", [{}, {"lora": {"r": 4, "alpha": 8}}, {"critic": True}], ids=["full", "lora", "critic"])
def test_checkpointed_training_forward_equals_the_cached_one(extra):
    plain, ckpt = _pair(**extra)
    assert sampling._checkpointing(ckpt.lm) and not sampling._checkpointing(plain.lm)  # the other path is taken
    batch = _batch(plain)
    outs, grads = [], []
    for policy in (plain, ckpt):
        policy.train()
        out = policy.evaluate(*batch)
        m = batch[1]["attn"]
        loss = -(out.logprob * m).sum() + (out.entropy * m).sum() + out.value.float().pow(2).mean()
        loss.backward()
        outs.append(out)
        grads.append({n: p.grad.clone() for n, p in policy.named_parameters() if p.grad is not None})
    m = batch[1]["attn"].bool()
    torch.testing.assert_close(outs[1].logprob[m], outs[0].logprob[m], rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(outs[1].entropy[m], outs[0].entropy[m], rtol=1e-4, atol=1e-5)
    if extra.get("critic"):
        torch.testing.assert_close(outs[1].value[m], outs[0].value[m], rtol=1e-4, atol=1e-5)
    assert grads[0].keys() == grads[1].keys() and grads[0]
    for name in grads[0]:
        torch.testing.assert_close(grads[1][name], grads[0][name], rtol=1e-3, atol=1e-5, msg=name)
