"""model=vla model.head=flow (rlinf_model_vla/flow_head.py on rlinf-model-mlp's flow.py): K noisy
action tokens after the prefix; acting (instruction cache, no gradient) and training (a gradient,
the instruction shared per minibatch or the full pass) score the same chain to the same log-prob,
for Flow-Noise and Flow-SDE; flow matching trains it; a checkpoint reloads it."""

from __future__ import annotations

import pytest
import torch

from rlinf_model_mlp.flow import CHAIN_KEY
from rlinf_model_vla.model import VLAPolicy
from tests.models.test_vla_model import _node, _spec
from tests.models.test_vla_prefix_cache import TEXTS, _mixed

pytestmark = pytest.mark.numerics  # results depend on CPU features: make test-portable runs them again

ATOL = 1e-5


def _policy(**over) -> VLAPolicy:
    torch.manual_seed(0)
    return VLAPolicy(_node(head="flow", chunk=3, flow_steps=3, **over), _spec())


@pytest.mark.parametrize("batch", [False, True], ids=["step-by-step", "batch-steps"])
@pytest.mark.parametrize("noise", ["noise", "sde"])
def test_acting_and_training_score_the_same_chain(noise, batch):
    policy = _policy(flow_noise=noise, flow_batch_steps=batch)
    plain = VLAPolicy(_node(head="flow", chunk=3, flow_steps=3, flow_noise=noise, prefix_cache=False,
                            flow_batch_steps=batch), _spec())
    plain.load_state_dict(policy.state_dict())
    obs = _mixed(10, 0, TEXTS)
    with torch.no_grad():
        torch.manual_seed(1)
        out = policy.act(obs)  # the instruction cache
        torch.manual_seed(1)
        ref = plain.act(obs)  # the full pass
    assert out.action.shape == (10, 3, 3) and policy.action_chunk == 3
    chain = out.extras[CHAIN_KEY]
    assert chain.shape == (10, 4, 9)
    torch.testing.assert_close(out.logprob, ref.logprob, rtol=0, atol=ATOL)
    torch.testing.assert_close(chain, ref.extras[CHAIN_KEY], rtol=0, atol=ATOL)
    batch = {**obs, CHAIN_KEY: chain}
    ev = policy.evaluate(batch, out.action)  # with a gradient: the instructions shared per minibatch
    torch.testing.assert_close(ev.logprob.detach(), out.logprob, rtol=0, atol=ATOL)
    torch.testing.assert_close(ev.value.detach(), out.value, rtol=0, atol=ATOL)
    ev_plain = plain.evaluate(batch, out.action)
    torch.testing.assert_close(ev_plain.logprob.detach(), out.logprob, rtol=0, atol=ATOL)
    # the gradient of the chain's log-prob reaches the action expert, the backbone and (Flow-Noise) the noise net
    (ev.logprob.mean() + ev.value.mean()).backward()
    assert policy.flow_tokens.action_in.weight.grad.abs().sum() > 0
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in policy.lm.parameters())
    if noise == "noise":
        assert policy.flow.noise_net[-1].weight.grad.abs().sum() > 0  # (its input layer: next step, the output starts at 0)


def test_flow_matching_trains_the_vla_and_a_checkpoint_reloads_it(tmp_path):
    from rlinf_cli.policy import load_policy

    policy = _policy()
    obs = _mixed(16, 2, TEXTS)
    target = torch.linspace(-0.8, 0.8, 9).view(1, 3, 3).expand(16, 3, 3)  # the same chunk for every row
    opt = torch.optim.Adam(policy.parameters(), 1e-3)
    losses = []
    for _ in range(60):
        loss = policy.imitation_loss(obs, target)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    assert sum(losses[-10:]) / 10 < 0.5 * sum(losses[:5]) / 5, losses
    with torch.no_grad():
        act = policy.act(obs, deterministic=True).action
    assert (act - target).abs().mean() < 0.2
    policy.save_pretrained(tmp_path / "ckpt")
    loaded = load_policy(tmp_path / "ckpt")
    with torch.no_grad():
        torch.manual_seed(3)
        a = policy.act(obs)
        torch.manual_seed(3)
        b = loaded.act(obs)
    torch.testing.assert_close(a.action, b.action, rtol=0, atol=0)
    torch.testing.assert_close(a.logprob, b.logprob, rtol=0, atol=0)


@pytest.mark.parametrize("noise", ["noise", "sde"])
def test_bf16_weights_act_and_evaluate_agree(noise):
    """DeepSpeed's bf16 casts the whole module: the backbone and the action expert run in bf16,
    while the chain, its Gaussian steps and the log-probs stay fp32 (the same ops in act and
    evaluate, so they agree; the tolerance is the chunk head's bf16 one)."""
    from tests.models.test_vla_model import _obs

    torch.manual_seed(0)
    policy = VLAPolicy(_node(head="flow", chunk=3, flow_steps=3, flow_noise=noise), _spec()).to(torch.bfloat16)
    obs = _obs(6)
    with torch.no_grad():
        out = policy.act(obs)
    chain = out.extras[CHAIN_KEY]
    assert out.action.dtype == out.logprob.dtype == chain.dtype == torch.float32
    ev = policy.evaluate({**obs, CHAIN_KEY: chain}, out.action)
    torch.testing.assert_close(ev.logprob.detach(), out.logprob, rtol=0, atol=0.05)
    ev.logprob.sum().backward()
    assert policy.flow_tokens.action_in.weight.grad.dtype == torch.bfloat16
