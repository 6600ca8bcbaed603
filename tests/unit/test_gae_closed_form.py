"""GAE (PPO's ``advantages``, the real function) against closed forms, not a second recursion.

With a constant value function V(s) = v and a constant reward r, every TD error inside an
episode is the same number

    delta = r + gamma * v - v                                   (1)

and GAE's advantage is a finite geometric sum of them. For a segment of T steps that does not
end (bootstrapped from V(s_T) = v), step t sees the T - t errors after it:

    A_t = sum_{k=0}^{T-1-t} (gamma*lam)^k * delta = delta * (1 - (gamma*lam)^(T-t)) / (1 - gamma*lam)   (2)

An episode that terminates at its last step (T - 1) has no next state: its last error is r - v,

    A_t = delta * (1 - (gamma*lam)^(T-1-t)) / (1 - gamma*lam) + (gamma*lam)^(T-1-t) * (r - v)        (3)

An episode truncated at its last step by a time limit did not end in the MDP: it bootstraps from
the value of the state it reached, V(s_T) (Stable-Baselines3 adds gamma * V(s_T) to the reward),
so with V(s_T) = v it gives (2) exactly, as if it had never been cut; with V(s_T) = w its last
error is r + gamma * w - v. lam = 1 turns (2) into the discounted return minus v plus the
bootstrap; lam = 0 into the one-step error (1).
"""

from __future__ import annotations

import pytest
import torch

from rlinf_cli.api import Experience

T, N = 12, 3


def _advantages(rewards, dones, trunc_values, values, last_value, gamma, lam):
    from rlinf_algos.ppo import PPO

    algo = PPO.from_config({"name": "ppo", "gamma": gamma, "gae_lambda": lam})
    exp = Experience({"state": torch.zeros(*rewards.shape, 1)}, torch.zeros(rewards.shape), torch.zeros(rewards.shape),
                     values, rewards, dones, trunc_values, torch.ones(rewards.shape), last_value)
    adv, ret = algo.advantages(exp)
    torch.testing.assert_close(ret, adv + values)  # returns are the value targets: A + V
    return adv.double()


def _constant(v: float, r: float, end: str, gamma: float, lam: float, w: float | None = None) -> torch.Tensor:
    """One [T, N] segment of constant value ``v`` and reward ``r`` whose last step ``end``s:
    "none" (the segment is cut by the rollout), "terminated" or "truncated" (bootstrap ``w``)."""
    dones, trunc = torch.zeros(T, N), torch.zeros(T, N)
    if end != "none":
        dones[-1] = 1.0
    if end == "truncated":
        trunc[-1] = v if w is None else w
    return _advantages(torch.full((T, N), r), dones, trunc, torch.full((T, N), v), torch.full((N,), v), gamma, lam)


def _geometric(delta: float, gl: float, n: torch.Tensor) -> torch.Tensor:
    """sum_{k=0}^{n-1} gl^k * delta, the closed form (2)."""
    return delta * n if gl == 1.0 else delta * (1 - gl ** n) / (1 - gl)


STEPS_LEFT = torch.arange(T, 0, -1, dtype=torch.float64)  # T - t for t = 0 .. T-1


@pytest.mark.parametrize("gamma,lam", [(0.99, 0.95), (0.9, 1.0), (0.97, 0.0), (1.0, 1.0), (0.5, 0.8)])
@pytest.mark.parametrize("v,r", [(2.0, 1.0), (-1.5, 0.25), (0.0, 1.0)])
def test_a_segment_that_does_not_end(v, r, gamma, lam):
    adv = _constant(v, r, "none", gamma, lam)
    want = _geometric(r + gamma * v - v, gamma * lam, STEPS_LEFT)
    torch.testing.assert_close(adv, want[:, None].expand(T, N), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("gamma,lam", [(0.99, 0.95), (0.9, 1.0), (0.97, 0.0), (0.5, 0.8)])
def test_a_terminated_episode_does_not_bootstrap(gamma, lam):
    v, r = 2.0, 1.0
    adv = _constant(v, r, "terminated", gamma, lam)
    gl = gamma * lam
    want = _geometric(r + gamma * v - v, gl, STEPS_LEFT - 1) + gl ** (STEPS_LEFT - 1) * (r - v)  # (3)
    torch.testing.assert_close(adv, want[:, None].expand(T, N), rtol=1e-5, atol=1e-5)
    assert float(adv[-1, 0]) == pytest.approx(r - v)  # the last step: reward alone, no V(s_T)


@pytest.mark.parametrize("gamma,lam", [(0.99, 0.95), (0.9, 1.0), (0.97, 0.0)])
def test_a_truncated_episode_bootstraps_from_its_final_state(gamma, lam):
    v, r = 2.0, 1.0
    # V(s_T) = v: exactly the segment that was never cut (SB3: reward += gamma * V(s_T))
    torch.testing.assert_close(_constant(v, r, "truncated", gamma, lam), _constant(v, r, "none", gamma, lam),
                               rtol=1e-6, atol=1e-6)
    # V(s_T) = w: the last error is r + gamma * w - v, and it reaches back (gamma*lam)^(T-1-t)
    w = 5.0
    adv = _constant(v, r, "truncated", gamma, lam, w)
    gl = gamma * lam
    want = _geometric(r + gamma * v - v, gl, STEPS_LEFT - 1) + gl ** (STEPS_LEFT - 1) * (r + gamma * w - v)
    torch.testing.assert_close(adv, want[:, None].expand(T, N), rtol=1e-5, atol=1e-5)
    assert float(adv[-1, 0]) == pytest.approx(r + gamma * w - v)


def test_lambda_one_is_the_discounted_return_minus_the_value():
    """lam = 1, terminated at T-1: A_0 = sum_k gamma^k r_k - v (Monte Carlo), for any rewards."""
    gamma, v = 0.9, 0.7
    rewards = torch.linspace(-1.0, 2.0, T)[:, None].expand(T, N).contiguous()
    dones = torch.zeros(T, N)
    dones[-1] = 1.0
    adv = _advantages(rewards, dones, torch.zeros(T, N), torch.full((T, N), v), torch.full((N,), v), gamma, 1.0)
    discounted = sum(gamma ** k * float(rewards[k, 0]) for k in range(T))
    assert float(adv[0, 0]) == pytest.approx(discounted - v, rel=1e-5)


def test_an_episode_end_inside_the_segment_cuts_the_sum():
    """Envs reset after an episode ends: steps before the end never see rewards after it."""
    gamma, lam, v, r = 0.99, 0.95, 1.0, 1.0
    cut = 4  # the episode terminates at step 4; a new one runs steps 5 .. T-1 and is bootstrapped
    dones = torch.zeros(T, N)
    dones[cut] = 1.0
    adv = _advantages(torch.full((T, N), r), dones, torch.zeros(T, N), torch.full((T, N), v), torch.full((N,), v),
                      gamma, lam)
    gl, delta = gamma * lam, r + gamma * v - v
    left = torch.arange(cut + 1, 0, -1, dtype=torch.float64)  # steps to the end of the first episode
    first = _geometric(delta, gl, left - 1) + gl ** (left - 1) * (r - v)
    second = _geometric(delta, gl, torch.arange(T - cut - 1, 0, -1, dtype=torch.float64))
    torch.testing.assert_close(adv[:, 0], torch.cat([first, second]), rtol=1e-5, atol=1e-5)
