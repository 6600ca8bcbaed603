"""Algorithm maths against plain reference implementations."""

from __future__ import annotations

import pytest
import torch

from rlinf_algos.grpo import GRPO, aggregate, group_advantages, informative_groups
from rlinf_algos.ppo import PPO, gae
from rlinf_cli.algorithm import MiniBatch, clipped_surrogate, masked_mean
from rlinf_cli.errors import UserError
from rlinf_cli.policy import EvalOutput
from rlinf_cli.experience import Experience

pytestmark = pytest.mark.numerics  # results depend on CPU features: make test-portable runs them again


def _rollout(T=6, N=3, seed=0):
    g = torch.Generator().manual_seed(seed)
    z = lambda: torch.zeros(T, N)  # noqa: E731
    dones = (torch.rand(T, N, generator=g) < 0.3).float()
    trunc = torch.rand(T, N, generator=g) * dones * (torch.rand(T, N, generator=g) < 0.5).float()
    return Experience({"state": z()}, z(), z(), torch.randn(T, N, generator=g), torch.randn(T, N, generator=g),
                      dones, trunc, torch.ones(T, N), torch.randn(N, generator=g))


def _gae_loop(r: Experience, gamma: float, lam: float) -> torch.Tensor:
    T, N = r.rewards.shape
    adv = torch.zeros(T, N)
    for n in range(N):
        running = 0.0
        for t in reversed(range(T)):
            next_v = r.last_value[n] if t == T - 1 else r.values[t + 1, n]
            if r.dones[t, n]:
                delta = r.rewards[t, n] + gamma * r.trunc_values[t, n] - r.values[t, n]
                running = delta
            else:
                delta = r.rewards[t, n] + gamma * next_v - r.values[t, n]
                running = delta + gamma * lam * running
            adv[t, n] = running
    return adv


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_gae_matches_per_env_loop(seed):
    r = _rollout(seed=seed)
    adv, ret = gae(r, 0.97, 0.9)
    torch.testing.assert_close(adv, _gae_loop(r, 0.97, 0.9))
    torch.testing.assert_close(ret, adv + r.values)


def test_group_advantages_normalise_within_groups():
    returns = torch.tensor([1.0, 2.0, 3.0, 10.0, 10.0, 10.0])
    adv = group_advantages(returns, 3)
    torch.testing.assert_close(adv[:3], torch.tensor([-1.0, 0.0, 1.0]), atol=1e-5, rtol=0)
    assert torch.all(adv[3:] == 0)  # an all-equal group carries no signal
    assert informative_groups(returns, 3).tolist() == [True, False]
    dr = group_advantages(returns, 3, scale=False)
    torch.testing.assert_close(dr[:3], torch.tensor([-1.0, 0.0, 1.0]))


def test_clip_higher_and_dual_clip():
    logratio = torch.log(torch.tensor([2.0, 2.0, 0.5, 10.0]))
    adv = torch.tensor([1.0, -1.0, 1.0, -1.0])
    loss, clipped = clipped_surrogate(logratio, adv, 0.2, 0.28)
    # positive advantage, ratio 2: clipped at 1.28; negative advantage, ratio 2: unclipped (pessimistic)
    torch.testing.assert_close(loss, torch.tensor([-1.28, 2.0, -0.5, 10.0]))
    assert clipped.tolist() == [True, False, False, False]
    dual, _ = clipped_surrogate(logratio, adv, 0.2, 0.2, dual_clip=3.0)
    assert dual[3].item() == pytest.approx(3.0)  # |adv| * c caps the very off-policy sample


def test_masked_mean_ignores_padding():
    x = torch.tensor([[1.0, 100.0], [3.0, 100.0]])
    mask = torch.tensor([[1.0, 0.0], [1.0, 0.0]])
    assert masked_mean(x, mask).item() == 2.0


def test_loss_aggregation_token_vs_sequence():
    # a 1-token completion with value 4 and a 3-token completion with value 0
    x = torch.tensor([[4.0, 9.0, 9.0], [0.0, 0.0, 0.0]])
    mask = torch.tensor([[1.0, 0.0, 0.0], [1.0, 1.0, 1.0]])
    assert aggregate(x, mask, "token").item() == pytest.approx(1.0)  # 4 / 4 valid tokens
    assert aggregate(x, mask, "sequence").item() == pytest.approx(2.0)  # (4 + 0) / 2 completions
    empty = torch.tensor([[1.0, 0.0, 0.0], [0.0, 0.0, 0.0]])  # a row without valid tokens does not count
    assert aggregate(x, empty, "sequence").item() == pytest.approx(4.0)
    steps = torch.tensor([1.0, 3.0])  # step-level minibatch: no sequences, both modes agree
    assert aggregate(steps, torch.ones(2), "sequence") == aggregate(steps, torch.ones(2), "token")


def test_ppo_loss_gradients_flow_and_stats_are_finite():
    algo = PPO.from_config({"name": "ppo"})
    logp = torch.zeros(8, requires_grad=True)
    value = torch.zeros(8, requires_grad=True)
    out = EvalOutput(logp, torch.ones(8), value)
    mb = MiniBatch(torch.zeros(8), torch.randn(8), torch.ones(8), torch.zeros(8))
    loss, stats = algo.loss(out, mb)
    loss.backward()
    assert logp.grad is not None and value.grad is not None and value.grad.abs().sum() > 0
    assert all(torch.isfinite(v) for v in stats.values())


@pytest.mark.parametrize("name", ["ppo", "grpo"])
def test_kl_to_the_reference_pulls_the_policy_back_and_is_zero_on_it(name):
    """kl_coef adds k3 KL(ref || policy): zero where the policy equals its reference, and its
    gradient moves each log-prob towards the reference's (PPO and GRPO share the estimator)."""
    algo = (PPO if name == "ppo" else GRPO).from_config({"name": name, "kl_coef": 0.5})
    assert algo.needs_reference()
    assert not (PPO if name == "ppo" else GRPO).from_config({"name": name}).needs_reference()
    ref = torch.tensor([-1.0, -2.0, -0.5, -1.5])
    adv = torch.zeros(4)  # no policy-gradient signal: only the KL term moves the log-probs
    mb = MiniBatch(ref.clone(), adv, torch.zeros(4), torch.zeros(4), ref_logprob=ref)
    on_ref = ref.clone().requires_grad_()
    loss, stats = algo.loss(EvalOutput(on_ref, torch.ones(4), torch.zeros(4)), mb)
    assert float(stats["kl_ref"]) == pytest.approx(0.0, abs=1e-7)
    away = (ref + torch.tensor([0.5, -0.5, 0.3, -0.3])).requires_grad_()
    loss, stats = algo.loss(EvalOutput(away, torch.ones(4), torch.zeros(4)), mb._replace(old_logprob=away.detach()))
    assert float(stats["kl_ref"]) > 0.01
    loss.backward()
    # gradient descent lowers log-probs above the reference and raises those below it
    assert torch.all(torch.sign(away.grad) == torch.sign(away.detach() - ref))


def test_grpo_steps_share_their_episode_advantage():
    algo = GRPO.from_config({"name": "grpo", "group_size": 2, "groups": 1})
    r = _rollout(T=4, N=2)
    r.episode_returns = torch.tensor([1.0, 3.0])
    r.mask = torch.tensor([[1.0, 1.0], [1.0, 1.0], [0.0, 1.0], [0.0, 1.0]])
    adv, _ = algo.advantages(r)
    assert torch.all(adv[:2, 0] < 0) and torch.all(adv[:, 1] > 0) and torch.all(adv[2:, 0] == 0)


@pytest.mark.parametrize("node, msg", [({"name": "ppo", "gamma": 1.5}, "gamma"),
                                       ({"name": "ppo", "clipratio": 0.1}, "Did you mean 'algo.clip_ratio'"),
                                       ({"name": "ppo", "kl_coef": -0.1}, "kl_coef"),
                                       ({"name": "ppo", "epochs": "many"}, "expected int"),
                                       ({"name": "grpo", "group_size": 1}, "group_size must be >= 2"),
                                       ({"name": "grpo", "loss_agg": "seq"}, "loss_agg must be one of")])
def test_config_validation_is_a_user_error(node, msg):
    cls = PPO if node["name"] == "ppo" else GRPO
    with pytest.raises(UserError, match=msg):
        cls.from_config(node)
