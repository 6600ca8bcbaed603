"""The transformers model plugin: tokenizer, sampling log-probs, save/load, import weight."""

from __future__ import annotations

import subprocess
import sys

import pytest

import torch

from rlinf_model_hf.model import HFCausalLM  # noqa: E402

pytestmark = pytest.mark.numerics  # results depend on CPU features: make test-portable runs them again

TINY = {"name": "hf", "hidden_size": 32, "layers": 1, "heads": 2, "kv_heads": 1, "intermediate_size": 64}


@pytest.fixture(scope="module")
def policy():
    torch.manual_seed(0)
    return HFCausalLM(TINY)


@pytest.mark.parametrize("text", ["12+34=46", " two  spaces\n\ttab ", "\\boxed{x}", "#### 7", "<calc>1*2</calc>", ""])
def test_char_tokenizer_round_trip(policy, text):
    ids = policy.encode_text(text)
    assert len(ids) == len(text)  # one token per character
    assert policy.decode(ids) == text  # Fuse decoder: no spaces inserted between characters
    assert policy.tokenizer.unk_token_id not in ids


def test_sampling_logprobs_match_training_logprobs(policy):
    from rlinf_model_hf.sampling import left_pad

    prompts = policy.encode_prompts(["1+2=", "34+5=", "7="])
    gen = policy.generate(prompts, samples=3, max_new_tokens=6, generator=torch.Generator().manual_seed(1))
    assert gen.tokens.shape[0] == 9 and len(gen.finish) == 9
    ids, mask = left_pad(prompts, policy.pad_token_id, "cpu")
    T = gen.tokens.shape[1]
    comp_mask = (torch.arange(T)[None] < gen.lengths[:, None]).long()
    logp, entropy = policy.token_logprobs(ids, mask, gen.tokens, comp_mask, 3)
    # the shared-prefix training forward reproduces the sampler's numbers: the PPO ratio starts at 1
    assert torch.allclose(logp * comp_mask, gen.logprobs * comp_mask, atol=1e-4)
    assert (entropy > 0).all()
    logp.sum().backward()  # gradients reach the weights through the repeated prompt cache
    assert policy.lm.model.embed_tokens.weight.grad.abs().sum() > 0
    policy.lm.zero_grad()


def test_greedy_is_deterministic(policy):
    prompts = policy.encode_prompts(["5+5="])
    a = policy.generate(prompts, samples=2, max_new_tokens=5, greedy=True)
    b = policy.generate(prompts, samples=1, max_new_tokens=5, greedy=True)
    assert torch.equal(a.tokens[0], a.tokens[1]) and torch.equal(a.tokens[0, : b.tokens.shape[1]], b.tokens[0])


def test_save_and_load_model_dir(policy, tmp_path):
    from transformers import AutoModelForCausalLM

    from rlinf_cli.policy import load_policy

    policy.save_pretrained(tmp_path / "ckpt")
    assert (tmp_path / "ckpt" / "model.safetensors").is_file() and (tmp_path / "ckpt" / "hf" / "tokenizer.json").is_file()
    loaded = load_policy(tmp_path / "ckpt")  # through the registry, by the name in config.json
    assert isinstance(loaded, HFCausalLM)
    for (k, a), (_, b) in zip(policy.lm.state_dict().items(), loaded.lm.state_dict().items()):
        assert torch.equal(a, b), k
    assert loaded.decode(loaded.encode_text("9+9=18")) == "9+9=18"
    # the reloaded character tokenizer keeps spaces (AutoTokenizer would pick Qwen2's, which drops them)
    assert loaded.encode_text("a b  c") == policy.encode_text("a b  c") and len(loaded.encode_text("a b  c")) == 6
    prompts = policy.encode_prompts(["12+3="])
    assert torch.equal(policy.generate(prompts, samples=1, max_new_tokens=4, greedy=True).tokens,
                       loaded.generate(prompts, samples=1, max_new_tokens=4, greedy=True).tokens)
    # the hf/ directory is a plain transformers model, and model.path= loads either form
    plain = AutoModelForCausalLM.from_pretrained(tmp_path / "ckpt" / "hf")
    assert plain.config.hidden_size == 32
    via_path = HFCausalLM({"name": "hf", "path": str(tmp_path / "ckpt")})
    assert torch.equal(via_path.lm.lm_head.weight, policy.lm.lm_head.weight)


def test_sampling_settings_come_from_generation_config_unless_set(tmp_path):
    policy = HFCausalLM(TINY)
    assert policy.temperature == 1.0 and policy.sampling.top_p == 1.0  # the tiny preset's config does not sample
    policy.lm.generation_config.do_sample = True
    policy.lm.generation_config.temperature, policy.lm.generation_config.top_p = 0.7, 0.9
    policy.save_pretrained(tmp_path / "ckpt")  # a model directory whose generation_config.json samples
    path = str(tmp_path / "ckpt")
    theirs = HFCausalLM({"name": "hf", "path": path})
    assert (theirs.temperature, theirs.sampling.top_p) == (0.7, 0.9)
    mine = HFCausalLM({"name": "hf", "path": path, "temperature": 1.0})
    assert (mine.temperature, mine.sampling.top_p) == (1.0, 0.9)  # what the user sets wins, key by key
    # the recorded log-probs follow the temperature in force (sampling and training agree)
    prompts = theirs.encode_prompts(["12+3="])
    gen = theirs.generate(prompts, samples=2, max_new_tokens=3, generator=torch.Generator().manual_seed(0))
    obs = {"prompt_ids": torch.tensor(prompts), "prompt_mask": torch.ones(1, len(prompts[0]), dtype=torch.long)}
    attn = (torch.arange(gen.tokens.shape[1])[None] < gen.lengths[:, None]).long()
    out = theirs.evaluate(obs, {"ids": gen.tokens, "attn": attn}, with_entropy=False)
    assert torch.allclose(out.logprob * attn, gen.logprobs * attn, atol=1e-4)


def test_bad_path_is_a_user_error(tmp_path):
    from rlinf_cli.errors import UserError

    with pytest.raises(UserError, match="not a transformers model directory"):
        HFCausalLM({"name": "hf", "path": str(tmp_path)})
    with pytest.raises(UserError, match="does not exist"):
        HFCausalLM({"name": "hf", "path": str(tmp_path), "gguf_file": "nope.gguf"})


def test_hook_modules_do_not_import_torch():
    code = ("import sys, rlinf_model_hf.plugin, rlinf_sim_reasoning.plugin, rlinf_algos.plugin; "
            "bad = [m for m in ('torch', 'transformers') if m in sys.modules]; print(bad); sys.exit(1 if bad else 0)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
