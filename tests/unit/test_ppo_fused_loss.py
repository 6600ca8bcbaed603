"""PPO's fused loss (``algo.fused_loss``): the same loss, diagnostics and gradients as autograd's graph."""

from __future__ import annotations

import pytest
import torch

from rlinf_cli.algorithm import MiniBatch
from rlinf_cli.policy import EvalOutput
from rlinf_algos.ppo import PPO

pytestmark = pytest.mark.numerics  # results depend on CPU features: make test-portable runs them again

CONFIGS = {
    "defaults (dual clip, value clip)": {},
    "plain (SB3's settings)": {"dual_clip": None, "clip_value": None},
    "entropy bonus": {"entropy_coef": 0.01, "value_coef": 1.0},
    "raw advantages": {"norm_adv": False, "clip_ratio": 0.1},
}


def _batch(n: int = 256) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, MiniBatch]:
    g = torch.Generator().manual_seed(3)
    logp = torch.randn(n, generator=g)
    # ratios from ~0.3 to ~3: both clips bind on some samples; large negative advantages meet the dual cap
    old = logp + 0.6 * torch.randn(n, generator=g)
    adv = 2.0 * torch.randn(n, generator=g)
    value, returns = torch.randn(n, generator=g), torch.randn(n, generator=g)
    old_values = value + 0.4 * torch.randn(n, generator=g)
    entropy = torch.full((n,), 1.3)
    return logp, value, entropy, MiniBatch(old, adv, returns, old_values)


def _run(cfg: dict, fused: bool, critic_only: bool = False):
    algo = PPO.from_config({**cfg, "fused_loss": fused})
    logp, value, entropy, mb = _batch()
    leaves = [t.clone().requires_grad_(True) for t in (logp, value, entropy)]
    loss, stats = algo.loss(EvalOutput(*leaves), mb)
    (stats["value_loss_raw"] if critic_only else loss).backward()
    return loss, stats, [t.grad for t in leaves]


@pytest.mark.parametrize("name", sorted(CONFIGS))
@pytest.mark.parametrize("critic_only", [False, True])
def test_fused_loss_equals_autograd(name: str, critic_only: bool) -> None:
    cfg = CONFIGS[name]
    loss_f, stats_f, grads_f = _run(cfg, True, critic_only)
    loss_s, stats_s, grads_s = _run(cfg, False, critic_only)
    assert "FusedLoss" in type(loss_f.grad_fn).__name__ and "FusedLoss" not in type(loss_s.grad_fn).__name__
    # the forward runs the same ops: loss and diagnostics bit for bit
    assert torch.equal(loss_f, loss_s)
    assert stats_f.keys() == stats_s.keys()
    for k in stats_s:
        assert torch.equal(stats_f[k].detach(), stats_s[k].detach()), k
    assert 0.1 < float(stats_s["clip_frac"]) < 0.9  # clipped and unclipped samples both present
    for what, gf, gs in zip(("logprob", "value", "entropy"), grads_f, grads_s):
        if gs is None or not gs.abs().max():  # no gradient (critic only) or autograd's zeros
            assert gf is None or not gf.abs().max(), what
            continue
        torch.testing.assert_close(gf, gs, rtol=1e-5, atol=1e-8, msg=what)
    if not critic_only:
        assert grads_s[0].abs().max() > 0 and (grads_s[0] == 0).any()  # the clip cut some gradients, not all


def test_dual_clip_caps_some_samples_in_the_test_batch() -> None:
    """The batch above exercises the dual clip's branch (otherwise the test would not cover it)."""
    logp, _, _, mb = _batch()
    adv = (mb.advantages - mb.advantages.mean()) / (mb.advantages.std() + 1e-8)
    ratio = torch.exp(logp - mb.old_logprob)
    assert ((adv < 0) & (-adv * ratio > -adv * 3.0)).any()


def test_fused_loss_steps_aside_for_the_kl_term() -> None:
    algo = PPO.from_config({"kl_coef": 0.1})
    logp, value, entropy, mb = _batch()
    mb = mb._replace(ref_logprob=mb.old_logprob + 0.1)
    loss, stats = algo.loss(EvalOutput(logp.requires_grad_(True), value.requires_grad_(True), entropy), mb)
    assert "FusedLoss" not in type(loss.grad_fn).__name__ and "kl_ref" in stats
