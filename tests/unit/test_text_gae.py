"""PPO on text through the shared path: GAE over the policy's tokens (tool output and padding are
no steps), and the loss on [B, T] token minibatches equal to the embodied loss on those tokens as
flat samples."""

from __future__ import annotations

import pytest
import torch

from rlinf_algos.ppo import PPO, gae
from rlinf_cli.algorithm import MiniBatch
from rlinf_cli.experience import Experience
from rlinf_cli.policy import EvalOutput


def _text_exp(values, mask, rewards) -> Experience:
    """A text experience: T steps x N columns x L tokens, every step a whole episode."""
    values, mask, rewards = (torch.tensor(x, dtype=torch.float32) for x in (values, mask, rewards))
    T, N, _ = values.shape
    zeros = torch.zeros(T, N)
    return Experience({}, {}, torch.zeros_like(values), values, rewards, torch.ones(T, N), zeros, torch.ones(T, N),
                      torch.zeros(N), token_mask=mask)


def test_gae_over_tokens_skips_tool_tokens_as_a_hand_computation():
    g, lam = 0.9, 0.8
    # column 0: two policy tokens, a tool result (3 tokens, recorded value 0), two policy tokens, padding;
    # reward 1. Column 1: three policy tokens then padding, reward 0.
    mask = [[[1, 1, 0, 0, 0, 1, 1, 0], [1, 1, 1, 0, 0, 0, 0, 0]]]
    values = [[[0.5, 0.4, 0.0, 0.0, 0.0, 0.7, 0.2, 0.0], [0.1, 0.2, 0.3, 0.0, 0.0, 0.0, 0.0, 0.0]]]
    adv, ret = gae(_text_exp(values, mask, [[1.0, 0.0]]), g, lam)
    assert adv.shape == ret.shape == (1, 2, 8)
    # by hand, over the policy's tokens only (positions 0, 1, 5, 6), the reward at the last one:
    a6 = 1.0 - 0.2  # the end: no bootstrap
    a5 = (g * 0.2 - 0.7) + g * lam * a6
    a1 = (g * 0.7 - 0.4) + g * lam * a5  # the next step after the tool result is position 5: one discount
    a0 = (g * 0.4 - 0.5) + g * lam * a1
    torch.testing.assert_close(adv[0, 0], torch.tensor([a0, a1, 0, 0, 0, a5, a6, 0]), atol=1e-6, rtol=0)
    b2 = 0.0 - 0.3
    b1 = (g * 0.3 - 0.2) + g * lam * b2
    b0 = (g * 0.2 - 0.1) + g * lam * b1
    torch.testing.assert_close(adv[0, 1], torch.tensor([b0, b1, b2, 0, 0, 0, 0, 0]), atol=1e-6, rtol=0)
    torch.testing.assert_close(ret, adv + torch.tensor(values), atol=1e-6, rtol=0)  # returns = A + V per token


def test_gae_over_tokens_keeps_episodes_apart():
    """A steps rollout of text (T one-completion episodes per column): a step's reward and values
    never reach the step before it, whatever its length."""
    first = ([[0.3, 0.6, 0.0]], [[1, 1, 0]], 1.0)
    second = ([[9.0, 0.0, 0.0]], [[1, 0, 0]], 5.0)
    both = _text_exp([first[0], second[0]], [first[1], second[1]], [[first[2]], [second[2]]])
    adv, _ = gae(both, 0.95, 0.9)
    alone, _ = gae(_text_exp([first[0]], [first[1]], [[first[2]]]), 0.95, 0.9)
    torch.testing.assert_close(adv[0], alone[0])
    assert adv[1, 0, 0].item() == pytest.approx(5.0 - 9.0)


def test_gae_without_tokens_is_unchanged():
    torch.manual_seed(0)
    T, N = 6, 3
    v, r = torch.randn(T, N), torch.randn(T, N)
    dones = torch.zeros(T, N)
    dones[2, 1] = 1.0
    exp = Experience({}, {}, torch.zeros(T, N), v, r, dones, torch.zeros(T, N), torch.ones(T, N), torch.randn(N))
    adv, ret = gae(exp, 0.99, 0.95)
    expected, nxt, last = torch.zeros(T, N), exp.last_value, torch.zeros(N)
    for t in reversed(range(T)):
        delta = r[t] + 0.99 * nxt * (1 - dones[t]) - v[t]
        last = delta + 0.99 * 0.95 * (1 - dones[t]) * last
        expected[t], nxt = last, v[t]
    torch.testing.assert_close(adv, expected, atol=1e-5, rtol=0)
    torch.testing.assert_close(ret, adv + v)


@pytest.mark.parametrize("clip_value", [0.2, None])
def test_token_loss_equals_the_flat_loss_on_the_policy_tokens(clip_value):
    """[B, T] minibatches with a token mask are the embodied loss over the masked tokens as flat
    samples: what lies off the mask (tool tokens, padding) changes nothing."""
    torch.manual_seed(0)
    B, T = 3, 7
    mask = (torch.rand(B, T) > 0.35).float()
    mask[:, 0] = 1.0
    on = mask.bool()

    def tensors():
        return [torch.randn(B, T) for _ in range(6)]

    logp, ent, value, old, adv, ret = tensors()
    old_v = value + 0.3 * torch.randn(B, T)
    algo = PPO.from_config({"clip_value": clip_value, "entropy_coef": 0.01, "fused_loss": False})
    noise = 100.0 * (1 - mask)  # garbage off the mask: must not matter

    def token_loss(shift: torch.Tensor):
        lp = (logp + shift).requires_grad_()
        out = EvalOutput(lp, ent + shift, value + shift)
        mb = MiniBatch(old + shift, (adv + shift) * mask, ret + shift, old_v + shift, mask=mask)
        loss, stats = algo.loss(out, mb)
        loss.backward()
        return loss, stats, lp.grad

    loss, stats, grad = token_loss(torch.zeros(B, T))
    loss_noisy, stats_noisy, grad_noisy = token_loss(noise)
    flat = lambda x: x[on]  # noqa: E731
    lp_flat = flat(logp).requires_grad_()
    loss_flat, stats_flat = algo.loss(EvalOutput(lp_flat, flat(ent), flat(value)),
                                      MiniBatch(flat(old), flat(adv), flat(ret), flat(old_v)))
    loss_flat.backward()
    torch.testing.assert_close(loss, loss_flat, atol=1e-6, rtol=0)
    torch.testing.assert_close(loss_noisy, loss_flat, atol=1e-6, rtol=0)
    for k in ("policy_loss", "value_loss", "entropy", "approx_kl", "clip_frac", "explained_variance"):
        torch.testing.assert_close(stats[k], stats_flat[k], atol=1e-5, rtol=0)
        torch.testing.assert_close(stats_noisy[k], stats_flat[k], atol=1e-5, rtol=0)
    torch.testing.assert_close(grad[on], lp_flat.grad, atol=1e-6, rtol=0)
    assert (grad_noisy[~on] == 0).all()
