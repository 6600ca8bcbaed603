"""LoRA on the transformers model plugin: only the adapter trains, the KL reference is the same
model with the adapter off (no copy), checkpoints rebuild the exact policy, export merges."""

from __future__ import annotations

import gc
import json
import shutil
from pathlib import Path

import pytest
import torch

from rlinf_cli.algorithm import OptimSpec
from rlinf_cli.errors import UserError
from rlinf_model_hf import lora
from rlinf_model_hf.model import HFCausalLM
from rlinf_model_hf.sampling import left_pad

pytestmark = pytest.mark.numerics  # results depend on CPU features: make test-portable runs them again

TINY = {"name": "hf", "hidden_size": 32, "layers": 2, "heads": 2, "kv_heads": 1, "intermediate_size": 64}
LORA = {"r": 4, "alpha": 8}


def _base_dir(root: Path, seed: int = 0) -> Path:
    """A plain transformers directory of a tiny model (a base that a checkpoint can reference)."""
    torch.manual_seed(seed)
    out = root / f"base{seed}"
    if not out.exists():
        HFCausalLM(TINY).export(out)
    return out


def _lora(base: Path | None = None, **options) -> HFCausalLM:
    torch.manual_seed(1)
    return HFCausalLM({**TINY, **({"path": str(base)} if base else {}), "lora": {**LORA, **options}})


def _batch(policy: HFCausalLM) -> tuple[dict, dict]:
    """One GRPO minibatch as the text rollout builds it: two prompts, three completions each."""
    prompts = policy.encode_prompts(["12+3=", "4+45="])
    gen = policy.generate(prompts, samples=3, max_new_tokens=5, generator=torch.Generator().manual_seed(3))
    ids, mask = left_pad(prompts, policy.pad_token_id, "cpu")
    attn = (torch.arange(gen.tokens.shape[1])[None] < gen.lengths[:, None]).long()
    return {"prompt_ids": ids, "prompt_mask": mask}, {"ids": gen.tokens, "attn": attn}


def _logp(policy, batch) -> torch.Tensor:
    with torch.no_grad():
        return policy.evaluate(*batch, with_entropy=False).logprob * batch[1]["attn"]


def _train_step(policy: HFCausalLM, batch, lr: float = 1e-2) -> None:
    from rlinf_cli.runtime.engine import make_engine

    engine = make_engine(policy, OptimSpec(lr=lr), {})
    loss = -(policy.evaluate(*batch).logprob * batch[1]["attn"]).sum()
    engine.backward(loss)
    engine.step()


def _perturb(policy: HFCausalLM, seed: int = 5) -> None:
    """A trained-looking adapter (B != 0), as after training."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in lora.adapter_parameters(policy.lm).values():
            p.add_(0.05 * torch.randn(p.shape, generator=g))


def _live_tensor_bytes() -> int:
    """Bytes of every distinct tensor storage alive in this process (what a copy of a model adds)."""
    gc.collect()
    seen: dict[int, int] = {}
    for obj in gc.get_objects():
        try:
            if issubclass(type(obj), torch.Tensor) and obj.device.type == "cpu":
                st = obj.untyped_storage()
                seen[st.data_ptr()] = st.nbytes()
        except (RuntimeError, ReferenceError):
            continue
    return sum(seen.values())


# -- settings and what trains ------------------------------------------------------------------------
@pytest.mark.parametrize("options, message", [
    ({"r": -1}, "bad model.lora config: r must be >= 0"),
    ({"r": 4, "targets": "everything"}, "targets must be a list of module names or all-linear"),
    ({"r": 4, "dropout": 1.0}, "dropout must be in"),
    ({"r": 4, "save_base": "sometimes"}, "save_base must be one of"),
    ({"r": 4, "rank": 4}, "'model.lora.rank' is not an option"),
    ({"r": 4, "targets": ["qkv"]}, "this model's linear layers are down_proj, gate_proj, k_proj, lm_head"),
])
def test_bad_lora_settings_are_one_line(options, message):
    with pytest.raises(UserError, match=message) as info:
        HFCausalLM({**TINY, "lora": options})
    assert "\n" not in str(info.value)


def test_only_the_adapter_trains_and_the_engine_optimizes_only_it():
    from rlinf_cli.runtime.engine import make_engine

    policy = _lora()
    trainable = {n for n, p in policy.named_parameters() if p.requires_grad}
    adapter = lora.adapter_parameters(policy.lm)
    assert trainable == {f"lm.{n}" for n in adapter} and trainable
    # r x (in + out) per adapted projection: q, k, v, o, gate, up, down in each of the 2 layers
    shapes = {"q_proj": (32, 32), "k_proj": (32, 16), "v_proj": (32, 16), "o_proj": (32, 32), "gate_proj": (32, 64),
              "up_proj": (32, 64), "down_proj": (64, 32)}
    assert sum(p.numel() for p in adapter.values()) == 2 * sum(4 * (i + o) for i, o in shapes.values())
    engine = make_engine(policy, OptimSpec(lr=1e-3), {})
    assert {id(p) for p in engine.params} == {id(p) for p in adapter.values()}
    # what the optimizer holds (LeanAdam: flat buffers over them) is the adapter's size, not the model's
    assert sum(p.numel() for g in engine.optimizer.param_groups for p in g["params"]) == \
        sum(p.numel() for p in adapter.values())
    # all-linear adapts every projection but the output layer
    wide = _lora(targets="all-linear")
    assert {n.split(".lora_")[0].rsplit(".", 1)[-1] for n in lora.adapter_parameters(wide.lm)} == set(shapes)


# -- the KL reference ------------------------------------------------------------------------------
def test_reference_is_the_base_with_the_adapter_off_and_copies_nothing(tmp_path):
    base_dir = _base_dir(tmp_path)
    policy, base = _lora(base_dir), HFCausalLM({**TINY, "path": str(base_dir)})
    batch = _batch(policy)
    before = _live_tensor_bytes()
    ref = policy.reference(policy)
    assert _live_tensor_bytes() - before < 4096  # nothing of the model was copied
    assert ref is not policy and not isinstance(ref, torch.nn.Module)
    assert torch.equal(_logp(ref, batch), _logp(policy, batch))  # B = 0 at the start: identical
    # another model object: the same weights, but MKL's sums may depend on where they lie in memory
    # (seen in the suite: bits differed after other tests ran first, never the values)
    assert torch.allclose(_logp(ref, batch), _logp(base, batch), rtol=0, atol=1e-5)

    _train_step(policy, batch)
    assert not torch.allclose(_logp(policy, batch), _logp(base, batch), atol=1e-4)  # the policy moved ...
    assert torch.allclose(_logp(ref, batch), _logp(base, batch), rtol=0, atol=1e-5)  # ... the reference is still the base
    base_now = lora.base_state_dict(policy.lm)
    assert all(torch.equal(base_now[k], v) for k, v in base.lm.state_dict().items())  # and the base never trained
    policy.train()
    _logp(ref, batch)
    assert policy.lm.training  # the reference scored in eval mode and left the training mode as it was

    # the default of a model without an adapter: a frozen deep copy, the size of the model
    model_bytes = sum(p.numel() * p.element_size() for p in base.parameters())
    before = _live_tensor_bytes()
    copy = base.reference(base)
    assert _live_tensor_bytes() - before >= model_bytes * 0.9 and not any(p.requires_grad for p in copy.parameters())


def test_reference_of_a_run_that_began_from_a_trained_adapter_is_that_adapter(tmp_path):
    policy = _lora(_base_dir(tmp_path))
    _perturb(policy)
    batch = _batch(policy)
    start = _logp(policy, batch)
    ref = policy.reference(policy)  # rl init=<lora checkpoint>: the starting adapter, swapped in per call
    assert torch.equal(_logp(ref, batch), start)
    _train_step(policy, batch)
    trained = {n: p.detach().clone() for n, p in lora.adapter_parameters(policy.lm).items()}
    assert not torch.allclose(_logp(policy, batch), start, atol=1e-4)
    assert torch.equal(_logp(ref, batch), start)
    assert all(torch.equal(p, trained[n]) for n, p in lora.adapter_parameters(policy.lm).items())  # swapped back

    # a resumed run: the init= checkpoint loaded again gives its adapter, on this policy's base
    policy.save_pretrained(tmp_path / "ckpt")
    again = HFCausalLM.from_pretrained(tmp_path / "ckpt")
    _train_step(policy, batch)
    ref = policy.reference(again)
    assert isinstance(ref, lora.Reference) and ref.policy is policy
    assert torch.equal(_logp(ref, batch), _logp(again, batch))
    # a resumed run that began from a fresh adapter: the base
    assert policy.reference(None).adapter is None


# -- checkpoints -----------------------------------------------------------------------------------
def test_a_checkpoint_with_a_stored_base_gives_identical_logprobs(tmp_path):
    policy = _lora()  # the tiny preset: randomly initialised, so the base is stored
    _perturb(policy)
    batch = _batch(policy)
    policy.save_pretrained(tmp_path / "ckpt")
    meta = json.loads((tmp_path / "ckpt" / "config.json").read_text())
    assert meta["lora"]["stored"] and (tmp_path / "ckpt" / "hf" / "model.safetensors").is_file()
    assert (tmp_path / "ckpt" / "model.safetensors").resolve() == (tmp_path / "ckpt" / "adapter" / lora.ADAPTER_FILE).resolve()
    assert meta["model"]["lora"]["r"] == 4 and meta["model"]["lora"]["targets"] == list(lora.DEFAULT_TARGETS)
    from rlinf_cli.policy import load_policy

    loaded = load_policy(tmp_path / "ckpt")  # through the registry, as rl init= and eval do
    assert torch.equal(_logp(loaded, batch), _logp(policy, batch))
    assert {n for n, p in loaded.named_parameters() if p.requires_grad} == \
        {n for n, p in policy.named_parameters() if p.requires_grad}  # the same adapter trains on
    # a checkpoint of the loaded policy stores the base again (it has no other home)
    loaded.save_pretrained(tmp_path / "again")
    assert json.loads((tmp_path / "again" / "config.json").read_text())["lora"]["stored"]
    with pytest.raises(UserError, match="is a LoRA checkpoint: continue its adapter with init="):
        HFCausalLM({**TINY, "path": str(tmp_path / "ckpt")})
    with pytest.raises(UserError, match="save_base=never, but the base model"):
        _lora(save_base="never").save_pretrained(tmp_path / "never")


def test_a_checkpoint_references_a_base_on_disk_and_refuses_a_changed_one(tmp_path):
    base_dir = _base_dir(tmp_path)
    policy = _lora(base_dir)
    _perturb(policy)
    batch = _batch(policy)
    policy.save_pretrained(tmp_path / "ckpt")
    meta = json.loads((tmp_path / "ckpt" / "config.json").read_text())
    assert not meta["lora"]["stored"] and not (tmp_path / "ckpt" / "hf").exists()
    assert meta["model"]["path"] == str(base_dir.resolve())
    assert torch.equal(_logp(HFCausalLM.from_pretrained(tmp_path / "ckpt"), batch), _logp(policy, batch))
    _lora(base_dir, save_base="always").save_pretrained(tmp_path / "always")
    assert (tmp_path / "always" / "hf" / "config.json").is_file()

    shutil.rmtree(base_dir)
    shutil.copytree(_base_dir(tmp_path, seed=7), base_dir)  # another model at the same place
    with pytest.raises(UserError, match="is not the one the adapter was trained on"):
        HFCausalLM.from_pretrained(tmp_path / "ckpt")
    shutil.rmtree(base_dir)
    with pytest.raises(UserError, match=r"is built on .*which cannot be loaded") as info:
        HFCausalLM.from_pretrained(tmp_path / "ckpt")
    assert "\n" not in str(info.value)


def test_a_base_from_an_rlinf_checkpoint_is_stored(tmp_path):
    torch.manual_seed(0)
    HFCausalLM(TINY).save_pretrained(tmp_path / "full")  # a full-model rlinf checkpoint (e.g. from sft)
    _lora(tmp_path / "full").save_pretrained(tmp_path / "ckpt")
    assert json.loads((tmp_path / "ckpt" / "config.json").read_text())["lora"]["stored"]
    _lora(tmp_path / "full", save_base="never").save_pretrained(tmp_path / "ref")
    assert json.loads((tmp_path / "ref" / "config.json").read_text())["model"]["path"] == str((tmp_path / "full").resolve())


# -- export ----------------------------------------------------------------------------------------
def test_export_merges_the_adapter_into_a_plain_transformers_directory(tmp_path):
    from transformers import AutoModelForCausalLM

    policy = _lora()
    _perturb(policy)
    ids = torch.tensor([policy.encode_prompts(["12+34=46"])[0]])
    with torch.no_grad():
        adapted = policy.lm(input_ids=ids).logits
        with policy.peft.disable_adapter():
            bare = policy.lm(input_ids=ids).logits
    assert "merged" in policy.export(tmp_path / "out")
    assert not (tmp_path / "out" / "adapter_config.json").exists()
    merged = AutoModelForCausalLM.from_pretrained(tmp_path / "out")
    assert not any("lora" in k for k in merged.state_dict())
    with torch.no_grad():
        got = merged(input_ids=ids).logits
    assert (adapted - bare).abs().max() > 1e-3  # the adapter matters here ...
    assert torch.allclose(got, adapted, atol=1e-5, rtol=0)  # ... and the merged model computes the same
    with torch.no_grad():
        assert torch.equal(policy.lm(input_ids=ids).logits, adapted)  # the policy itself is left as it was
