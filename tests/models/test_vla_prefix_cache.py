"""model=vla's instruction KV cache (model.prefix_cache): the same numbers as the full pass, reuse
across steps and envs, and no stale keys after the weights change."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from rlinf_model_vla.model import VLAPolicy
from tests.models.test_vla_model import _node, _obs, _spec

pytestmark = pytest.mark.numerics  # results depend on CPU features: make test-portable runs them again

# Meta-World-like instructions of different lengths (the tiny preset's tokenizer is per character)
TEXTS = ["reach the goal position", "push the puck to the goal", "open the door",
         "press the button from the top", "close the window"]
ATOL = 1e-5


def _pair(**over) -> tuple[VLAPolicy, VLAPolicy]:
    """The same weights twice: prefix_cache on (the default) and off."""
    torch.manual_seed(0)
    cached = VLAPolicy(_node(**over), _spec())
    plain = VLAPolicy(_node(**over, prefix_cache=False), _spec())
    plain.load_state_dict(cached.state_dict())
    return cached, plain


def _mixed(n: int, seed: int, texts: list[str]) -> dict:
    rng = np.random.default_rng(seed)
    return _obs(n, seed, [texts[int(i)] for i in rng.integers(0, len(texts), n)])


def _same(cached: VLAPolicy, plain: VLAPolicy, obs: dict) -> None:
    """act (greedy and sampled), get_value and evaluate agree between the two policies."""
    with torch.no_grad():
        for deterministic in (True, False):
            torch.manual_seed(1)
            a = cached.act(obs, deterministic=deterministic)
            torch.manual_seed(1)
            b = plain.act(obs, deterministic=deterministic)
            torch.testing.assert_close(a.action, b.action, rtol=0, atol=ATOL)
            torch.testing.assert_close(a.logprob, b.logprob, rtol=0, atol=ATOL)
            torch.testing.assert_close(a.value, b.value, rtol=0, atol=ATOL)
        torch.testing.assert_close(cached.get_value(obs), plain.get_value(obs), rtol=0, atol=ATOL)
        ev_cached = cached.evaluate(obs, b.action)
        ev_plain = plain.evaluate(obs, b.action)
    for x, y in zip(ev_cached, ev_plain):
        torch.testing.assert_close(x, y, rtol=0, atol=ATOL)
    # and the act-vs-training identity PPO's first ratio relies on, across the two paths
    torch.testing.assert_close(ev_plain.logprob, a.logprob, rtol=0, atol=ATOL)


@pytest.mark.parametrize("head", ["tokens", "chunk"])
def test_cached_instruction_prefix_gives_the_full_pass_numbers(head):
    cached, plain = _pair(head=head)
    # several steps, batches mixing instructions of different lengths (left padding), a batch
    # whose instructions all differ from the first, and one env alone
    for seed, n, texts in ((0, 8, TEXTS), (1, 8, TEXTS), (2, 5, TEXTS[3:]), (3, 1, TEXTS[:1]), (4, 8, TEXTS)):
        _same(cached, plain, _mixed(n, seed, texts))
    # each instruction went through the backbone once for all those steps and envs
    assert cached._prefix_kv.computed == len(TEXTS)
    assert plain._prefix_kv.computed == 0


def test_cache_is_not_used_with_a_gradient():
    cached, plain = _pair()
    obs = _mixed(6, 0, TEXTS)
    ev = cached.evaluate(obs, torch.zeros(6, 3))
    ev.logprob.sum().backward()  # the instruction's keys carry gradients: the full pass ran
    assert cached._prefix_kv.computed == 0
    assert cached.lm.get_input_embeddings().weight.grad is not None
    with torch.no_grad():
        ref = plain.evaluate(obs, torch.zeros(6, 3))
    torch.testing.assert_close(ev.logprob.detach(), ref.logprob, rtol=0, atol=ATOL)


def _train_step(engine, policy: VLAPolicy, obs: dict) -> None:
    with torch.no_grad():
        action = policy.act(obs).action
    ev = policy.evaluate(obs, action)
    engine.backward(-(ev.logprob.mean() + ev.value.mean()))
    engine.step()


@pytest.mark.parametrize("head", ["tokens", "chunk"])
def test_cache_is_dropped_when_the_weights_change(head):
    from rlinf_cli.algorithm import OptimSpec
    from rlinf_cli.runtime.engine import make_engine

    cached, plain = _pair(head=head)
    obs = _mixed(6, 0, TEXTS)
    engine = make_engine(cached, OptimSpec(lr=1e-2), {"backend": "torch"})  # LeanAdam, as in rl/sft

    def outputs() -> torch.Tensor:  # greedy action (the chunk head's mean), its log-prob, the value
        with torch.no_grad():
            torch.manual_seed(2)
            out = plain.act(obs)
            return torch.cat([out.action.flatten(), out.logprob, out.value])

    def changed_and_fresh() -> None:
        before = outputs()
        plain.load_state_dict(cached.state_dict())
        after = outputs()
        # the change is large enough that a stale cache would show ...
        assert float((after - before).abs().max()) > 1e-3
        # ... and the cached policy computes with the new weights
        _same(cached, plain, obs)

    _same(cached, plain, obs)  # the cache is filled
    for _ in range(3):  # torch's first Adam step, then LeanAdam's flat-buffer steps (which write
        _train_step(engine, cached, obs)  # parameters around their version counters)
        changed_and_fresh()
    # an in-place edit of one backbone weight
    with torch.no_grad():
        cached.lm.base_model.layers[0].self_attn.k_proj.weight.mul_(1.5)
    changed_and_fresh()
    # weights loaded from elsewhere (a checkpoint, the overlapped rollout process's sync)
    torch.manual_seed(5)
    other = VLAPolicy(_node(head=head), _spec())
    cached.load_state_dict(other.state_dict())
    changed_and_fresh()
    # writes that bypass all of the above are the caller's to announce
    with torch.no_grad():
        cached.lm.base_model.layers[0].self_attn.v_proj.weight.data.mul_(0.5)
    cached.invalidate_prefix_cache()
    changed_and_fresh()


def test_inputs_without_an_instruction_or_without_anything_else():
    obs = _mixed(4, 0, TEXTS)
    # no text entry: the prefix is <bos> alone, cached like any instruction
    cached, plain = _pair(obs_keys=["state", "rgb"])
    _same(cached, plain, obs)
    # text alone: the value and the first action read the instruction's last token, which the
    # cache does not hold, so the full pass runs
    cached, plain = _pair(obs_keys=["instruction"])
    _same(cached, plain, obs)
    assert cached._prefix_kv.computed == 0


def _grads(policy: VLAPolicy) -> dict[str, torch.Tensor]:
    return {n: p.grad.clone() for n, p in policy.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("head", ["tokens", "chunk"])
def test_training_pass_shares_each_instruction_and_gives_the_full_pass_gradients(head, monkeypatch):
    """With a gradient, each distinct instruction of a minibatch runs once and its rows share its
    keys/values: the loss and every parameter's gradient equal the full pass's."""
    cached, plain = _pair(head=head)
    obs = _mixed(16, 5, TEXTS)  # 16 rows, at most 5 distinct instructions of different lengths
    with torch.no_grad():
        action = plain.act(obs).action
    shared_calls = []
    real = VLAPolicy._shared_instruction_kv
    monkeypatch.setattr(VLAPolicy, "_shared_instruction_kv",
                        lambda self, *a: shared_calls.append(a[0]) or real(self, *a))
    outs = []
    for policy in (cached, plain):
        policy.zero_grad()
        ev = policy.evaluate(obs, action)
        (ev.logprob.sum() + ev.value.sum() + 0.1 * ev.entropy.sum()).backward()
        outs.append((ev, _grads(policy)))
    assert len(shared_calls) == 1  # the cached policy took the shared path, the plain one did not
    for x, y in zip(outs[0][0], outs[1][0]):
        torch.testing.assert_close(x, y, rtol=0, atol=ATOL)
    assert outs[0][1].keys() == outs[1][1].keys() and len(outs[0][1]) > 10
    for name, g in outs[0][1].items():
        torch.testing.assert_close(g, outs[1][1][name], rtol=1e-4, atol=1e-5, msg=name)
    # the instruction's tokens enter only through the shared pass: their embedding rows got a gradient
    ids = sorted({i for t in set(obs["instruction"]) for i in cached._text_ids(str(t))})
    assert cached.lm.get_input_embeddings().weight.grad[ids].abs().sum(-1).gt(0).all()
