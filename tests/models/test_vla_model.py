"""The VLA model plugin (model=vla): action-token log-probs, save/load, the instruction, the CLI loop."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

from rlinf_cli.api import ArraySpec, EnvSpec
from rlinf_model_vla.model import VLAPolicy

pytestmark = pytest.mark.numerics  # results depend on CPU features: make test-portable runs them again

CONF = "plugins_models/rlinf-model-vla/rlinf_model_vla/conf/model/vla.yaml"
SMALL = {"backbone": {"hidden_size": 64, "layers": 2, "heads": 2, "kv_heads": 1, "intermediate_size": 128}}
INSTRUCTIONS = ["reach the goal position", "push the puck to the goal", "open the door"]


def _node(**over) -> dict:
    from pathlib import Path

    node = OmegaConf.to_container(OmegaConf.load(Path(__file__).resolve().parents[2] / CONF))
    return {**node, **SMALL, **over}


def _spec(discrete: bool = False, image: bool = True) -> EnvSpec:
    obs = {"state": ArraySpec((7,), "float32"), "task_id": ArraySpec((), "int64"), "instruction": ArraySpec((), "str")}
    if image:
        obs["rgb"] = ArraySpec((32, 32, 3), "uint8", 0, 255)
    action = ArraySpec((), "int64") if discrete else ArraySpec((3,), "float32", -1.0, 1.0)
    return EnvSpec(obs, action, num_actions=5 if discrete else None)


def _obs(n: int, seed: int = 0, instructions=None) -> dict:
    g = torch.Generator().manual_seed(seed)
    texts = instructions or [INSTRUCTIONS[i % len(INSTRUCTIONS)] for i in range(n)]
    return {"state": torch.randn(n, 7, generator=g), "task_id": torch.zeros(n, dtype=torch.long),
            "rgb": torch.randint(0, 256, (n, 32, 32, 3), generator=g, dtype=torch.uint8),
            "instruction": np.array(texts, dtype=object)}


def _policy(**over) -> VLAPolicy:
    torch.manual_seed(0)
    return VLAPolicy(_node(**over), _spec(discrete=over.pop("discrete", False) if "discrete" in over else False))


@pytest.mark.parametrize("vision", ["cnn", "hf"])
@pytest.mark.parametrize("discrete", [False, True])
def test_action_token_logprobs_match_between_acting_and_training(vision, discrete):
    torch.manual_seed(0)
    policy = VLAPolicy(_node(vision=vision, vit_patch_size=8, vit_hidden_size=32), _spec(discrete))
    obs = _obs(6)  # three instructions of different lengths: rows are left-padded
    with torch.no_grad():
        for deterministic in (False, True):
            out = policy.act(obs, deterministic=deterministic)
            ev = policy.evaluate(obs, out.action)
            # the KV-cache decode and the teacher-forced pass score the same tokens
            torch.testing.assert_close(ev.logprob, out.logprob, rtol=0, atol=1e-5)
            torch.testing.assert_close(ev.value, out.value, rtol=0, atol=1e-5)
        torch.testing.assert_close(policy.get_value(obs), out.value, rtol=0, atol=1e-5)
        # a row's numbers do not depend on what else is in the minibatch (padding is masked)
        alone = policy.evaluate({k: v[2:3] for k, v in obs.items()}, out.action[2:3])
        torch.testing.assert_close(alone.logprob, ev.logprob[2:3], rtol=0, atol=1e-5)
    if discrete:
        assert out.action.dtype == torch.int64 and out.action.shape == (6,) and int(out.action.max()) < 5
        return
    assert out.action.shape == (6, 3) and float(out.action.abs().max()) < 1.0
    # actions are bin centres: they map back to the bins they came from
    assert torch.equal(policy.to_bins(policy.from_bins(policy.to_bins(out.action))), policy.to_bins(out.action))
    # entropy of an untrained head is near uniform over the bins of each dimension
    assert abs(float(ev.entropy.mean()) - 3 * np.log(policy.nbins)) < 0.5
    # mean_action (algo.loss=mse) is differentiable and inside the bounds
    mean = policy.mean_action(obs)
    mean.sum().backward()
    assert mean.shape == (6, 3) and float(mean.detach().abs().max()) < 1.0
    assert policy.lm.get_input_embeddings().weight.grad is not None


def test_demonstrated_actions_score_their_bin():
    policy = _policy()
    a = torch.tensor([[-1.0, 0.0, 1.0], [-0.999, 0.01, 0.999]])
    bins = policy.to_bins(a)
    assert bins.tolist() == [[0, 32, 63], [0, 32, 63]]  # 64 bins over [-1, 1]; the bounds fall in the end bins
    with torch.no_grad():
        lp = policy.evaluate(_obs(2), a).logprob
        lp_centres = policy.evaluate(_obs(2), policy.from_bins(bins)).logprob
    torch.testing.assert_close(lp, lp_centres, rtol=0, atol=0)


@pytest.mark.parametrize("vision", ["cnn", "hf"])
def test_save_load_round_trip(vision, tmp_path):
    from rlinf_cli.policy import load_policy

    torch.manual_seed(0)
    policy = VLAPolicy(_node(vision=vision, vit_patch_size=8, vit_hidden_size=32), _spec())
    obs = _obs(4)
    with torch.no_grad():
        out = policy.act(obs)
        ev = policy.evaluate(obs, out.action)
    policy.save_pretrained(tmp_path / "ckpt")
    assert (tmp_path / "ckpt" / "model.safetensors").is_file() and (tmp_path / "ckpt" / "backbone" / "tokenizer.json").is_file()
    assert json.loads((tmp_path / "ckpt" / "config.json").read_text())["model"]["name"] == "vla"
    loaded = load_policy(tmp_path / "ckpt")  # through the registry, by the name in config.json
    assert isinstance(loaded, VLAPolicy)
    for (k, a), (_, b) in zip(policy.state_dict().items(), loaded.state_dict().items()):
        assert torch.equal(a, b), k
    # the tokenizer came back as itself (spaces kept), so the instruction tokens are the same
    assert loaded._text_ids("a b  c") == policy._text_ids("a b  c")
    with torch.no_grad():
        again = loaded.evaluate(obs, out.action)
        torch.testing.assert_close(again.logprob, ev.logprob, rtol=0, atol=0)
        torch.testing.assert_close(loaded.act(obs, deterministic=True).action, policy.act(obs, deterministic=True).action)


def test_backbone_and_vision_from_local_directories(tmp_path):
    """The loading code for real checkpoints: an LM directory (saved by model=hf) and a
    transformers vision model directory, as a downloaded model would be laid out."""
    from transformers import ViTConfig, ViTModel

    from rlinf_model_hf.model import HFCausalLM

    torch.manual_seed(0)
    lm = HFCausalLM({"name": "hf", "hidden_size": 32, "layers": 1, "heads": 2, "kv_heads": 1, "intermediate_size": 64})
    lm.save_pretrained(tmp_path / "lm")
    vit = ViTModel(ViTConfig(image_size=32, patch_size=8, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                             intermediate_size=64), add_pooling_layer=False)
    vit.save_pretrained(tmp_path / "vit")
    (tmp_path / "vit" / "preprocessor_config.json").write_text(json.dumps({"image_mean": [0.4] * 3, "image_std": [0.2] * 3}))
    node = _node(vision="hf", vision_path=str(tmp_path / "vit"), backbone={"path": str(tmp_path / "lm")})
    policy = VLAPolicy(node, _spec())
    lm_weights = lm.lm.state_dict()
    for k, v in policy.lm.state_dict().items():
        if "embed_tokens" in k or "lm_head" in k:
            assert torch.equal(v[: lm_weights[k].shape[0]], lm_weights[k])  # bin tokens appended after the vocabulary
        else:
            assert torch.equal(v, lm_weights[k]), k
    for k, v in vit.state_dict().items():
        assert torch.equal(policy.vision["rgb"].encoder.state_dict()[k], v), k
    assert torch.allclose(policy.vision["rgb"].mean, torch.tensor(0.4))
    policy.save_pretrained(tmp_path / "ckpt")  # and it reloads without the original directories
    (tmp_path / "lm" / "model.safetensors").unlink()
    loaded = VLAPolicy.from_pretrained(tmp_path / "ckpt")
    obs = _obs(3)
    a = torch.zeros(3, 3)
    with torch.no_grad():
        torch.testing.assert_close(loaded.evaluate(obs, a).logprob, policy.evaluate(obs, a).logprob, rtol=0, atol=0)


def test_bad_config_and_input_get_one_line():
    from rlinf_cli.errors import UserError

    with pytest.raises(UserError, match="head must be one of tokens, chunk, flow"):
        VLAPolicy(_node(head="diffusion"), _spec())
    for head in ("chunk", "flow"):
        with pytest.raises(UserError, match="needs continuous actions"):
            VLAPolicy(_node(head=head), _spec(discrete=True))
    with pytest.raises(UserError, match="flow_noise must be one of noise, sde"):
        VLAPolicy(_node(head="flow", flow_noise="ode"), _spec())
    with pytest.raises(UserError, match="simulator has no"):
        VLAPolicy(_node(obs_keys=["depth"]), _spec())
    spec = EnvSpec({"state": ArraySpec((3,), "float32")}, ArraySpec((2,), "float32"))
    with pytest.raises(UserError, match="bounds"):
        VLAPolicy(_node(), spec)


def test_the_instruction_changes_the_output():
    policy = _policy()
    obs = _obs(2, instructions=[INSTRUCTIONS[0], INSTRUCTIONS[0]])
    obs = {k: v[:1].repeat(2, *[1] * (v.dim() - 1)) if isinstance(v, torch.Tensor) else v for k, v in obs.items()}
    swapped = dict(obs, instruction=np.array([INSTRUCTIONS[0], INSTRUCTIONS[1]], dtype=object))
    a = torch.zeros(2, 3)
    with torch.no_grad():
        same = policy.evaluate(obs, a).logprob
        diff = policy.evaluate(swapped, a).logprob
    # rows of one batch agree to rounding (not bit for bit: the kernels' blocking depends on the CPU)
    torch.testing.assert_close(same[1], same[0], rtol=0, atol=1e-5)
    torch.testing.assert_close(diff[0], same[0], rtol=0, atol=1e-5)
    assert abs(float(diff[1] - diff[0])) > 1e-3

    # and a policy trained on two instructions with the same observation follows the instruction
    targets = torch.tensor([[0.5, -0.5, 0.25], [-0.5, 0.5, -0.25]])
    batch = {k: v[:1].repeat(16, *[1] * (v.dim() - 1)) if isinstance(v, torch.Tensor) else v for k, v in obs.items()}
    batch["instruction"] = np.array([INSTRUCTIONS[i % 2] for i in range(16)], dtype=object)
    actions = targets[torch.arange(16) % 2]
    opt = torch.optim.Adam(policy.parameters(), lr=3e-3)
    for _ in range(150):
        loss = -policy.evaluate(batch, actions).logprob.mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    with torch.no_grad():
        greedy = policy.act({k: v[:2] for k, v in batch.items()}, deterministic=True).action
    assert torch.allclose(greedy, targets, atol=1 / 64 + 1e-6), greedy  # the bin centre of each target


def test_registration_does_not_import_torch():
    import subprocess
    import sys

    code = ("import sys, rlinf_model_vla.plugin; from rlinf_cli.registry import get_registry; "
            "get_registry().get('model', 'vla'); print('torch' in sys.modules, 'transformers' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out == ["False", "False"]


@pytest.mark.parametrize("head", ["tokens", "chunk"])
def test_bf16_weights_act_and_evaluate_agree(head):
    # DeepSpeed's bf16 casts the whole module: inputs follow the weights' dtype, while bins,
    # log-probs and values stay fp32 (bf16 bounds would move the bin edges)
    torch.manual_seed(0)
    policy = VLAPolicy(_node(head=head), _spec()).to(torch.bfloat16)
    obs = _obs(6)
    with torch.no_grad():
        out = policy.act(obs)
    ev = policy.evaluate(obs, out.action)
    assert out.action.dtype == out.logprob.dtype == ev.logprob.dtype == ev.value.dtype == torch.float32
    # bf16 keeps ~3 significant digits: the decode and the one-pass scoring agree to that
    torch.testing.assert_close(ev.logprob.detach(), out.logprob, rtol=0, atol=0.05)
    assert 1.0 < float(-out.logprob.mean()) < 30.0  # a real log-prob, not a collapsed one
    ev.logprob.sum().backward()
    assert policy.lm.get_input_embeddings().weight.grad.dtype == torch.bfloat16
    if head == "tokens":
        bins = policy.to_bins(out.action)
        assert torch.equal(policy.to_bins(policy.from_bins(bins)), bins)
