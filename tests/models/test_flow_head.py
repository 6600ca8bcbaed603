"""The flow-matching action expert (rlinf_model_mlp/flow.py) on model=mlp: acting and training
score the same denoising chain to the same log-prob (Flow-Noise and Flow-SDE, chunks, through the
rollout's recorded extras), flow matching learns a two-mode action distribution that an MSE head
averages, and a checkpoint reloads to the same policy."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from rlinf_cli.api import ArraySpec, EnvSpec, UserError

pytestmark = pytest.mark.numerics  # results depend on CPU features: make test-portable runs them again

SPEC = EnvSpec({"state": ArraySpec((3,), "float32")}, ArraySpec((2,), "float32", -1.0, 1.0), max_episode_steps=12)


def _policy(spec: EnvSpec = SPEC, **over):
    from rlinf_model_mlp.model import MLPPolicy

    cfg = {"name": "mlp", "head": "flow", "chunk": 3, "flow_steps": 4, **over}
    return MLPPolicy(cfg, spec)


@pytest.mark.parametrize("batch", [False, True], ids=["step-by-step", "batch-steps"])
@pytest.mark.parametrize("noise", ["noise", "sde"])
def test_act_and_evaluate_give_the_same_logprob(noise, batch):
    from rlinf_model_mlp.flow import CHAIN_KEY

    torch.manual_seed(0)
    policy = _policy(flow_noise=noise, flow_batch_steps=batch)
    obs = {"state": torch.randn(16, 3)}
    with torch.no_grad():
        out = policy.act(obs)
    assert out.action.shape == (16, 3, 2) and policy.action_chunk == 3
    chain = out.extras[CHAIN_KEY]
    assert chain.shape == (16, 5, 6)
    # the action is the chain's last state, mapped from [-1, 1] back to the bounds (here the same)
    torch.testing.assert_close(out.action.reshape(16, -1), chain[:, -1])
    ev = policy.evaluate({**obs, CHAIN_KEY: chain}, out.action)
    assert (ev.logprob - out.logprob).abs().max() < 1e-5
    assert torch.isfinite(ev.entropy).all() and ev.entropy.shape == (16,)
    # scoring depends on the chain: another chain ending in the same action scores differently
    other = chain.clone()
    other[:, 1] += 0.1
    assert (policy.evaluate({**obs, CHAIN_KEY: other}, out.action).logprob - out.logprob).abs().min() > 1e-3
    # a PPO-style gradient reaches the velocity network and (Flow-Noise) the noise network
    ev.logprob.mean().backward()
    assert policy.velocity.net[0].weight.grad.abs().sum() > 0
    if noise == "noise":
        assert policy.flow.noise_net[-1].weight.grad.abs().sum() > 0
    else:
        assert not hasattr(policy.flow, "noise_net")


def test_flow_sde_keeps_the_marginal_of_the_ode():
    """With a velocity field known in closed form (data = a point mass at c: v(x, t) = (c - x) / (1 - t)
    ... the ODE's marginal at t is N(t c, (1 - t)^2)), Flow-SDE's chain keeps x_t's mean and std near the ODE's at every step."""
    from rlinf_model_mlp.flow import FlowHead, FlowSettings

    torch.manual_seed(0)
    n, c = 10, 0.6
    head = FlowHead(FlowSettings(steps=n, noise="sde", sde_level=0.5), 1, 1)

    def field(x, t):  # the exact rectified-flow velocity towards a point mass at c
        return (c - x) / (1.0 - t).clamp_min(1e-6).unsqueeze(-1)

    _, _, chain = head.sample(field, torch.zeros(20000, 1))
    for k in range(n + 1):
        t = k / n
        x = chain[:, k, 0]
        assert abs(float(x.mean()) - t * c) < 0.03, (k, float(x.mean()))
        assert abs(float(x.std()) - (1 - t)) < 0.06 + 0.05 * (k == n), (k, float(x.std()))


def test_the_rollout_records_the_chain_and_training_scores_it_again():
    """Through the runtime: the Runner stores ActOutput.extras beside the observations (chunks
    executed by the chunking wrapper), and evaluate on the experience's rows gives the acting log-probs."""
    from rlinf_cli.runtime.chunking import ChunkedSimulator
    from rlinf_cli.runtime.rollout import Runner
    from rlinf_cli.runtime.vector import SyncVecEnv
    from rlinf_model_mlp.flow import CHAIN_KEY
    from tests.unit.test_action_chunks import _CountingSim

    torch.manual_seed(1)
    sim = _CountingSim()
    policy = _policy(EnvSpec({"state": ArraySpec((1,), "float32")}, sim.spec.action, max_episode_steps=9))
    env = SyncVecEnv(ChunkedSimulator(sim, 3), [0, 1], autoreset=True)
    runner = Runner(env, policy)
    runner.reset([0, 1])
    exp = runner.collect_steps(5)
    assert exp.obs[CHAIN_KEY].shape == (5, 2, 5, 6)
    flat = {k: v.reshape(10, *v.shape[2:]) for k, v in exp.obs.items()}
    ev = policy.evaluate(flat, exp.actions.reshape(10, 3, 2))
    assert (ev.logprob - exp.logprobs.reshape(10)).abs().max() < 1e-5


def test_an_action_without_its_chain_is_refused_in_one_line():
    policy = _policy()
    with pytest.raises(UserError, match="denoising chain"):
        policy.evaluate({"state": torch.zeros(2, 3)}, torch.zeros(2, 3, 2))
    with pytest.raises(UserError, match="algo.loss=nll"):
        policy.mean_action({"state": torch.zeros(2, 3)})


def _two_modes(n: int, gen: torch.Generator) -> torch.Tensor:
    """Demonstrations whose action is +0.7 or -0.7 (both entries), half each, whatever the state."""
    sign = torch.where(torch.rand(n, generator=gen) < 0.5, -1.0, 1.0)
    return (0.7 * sign).unsqueeze(-1).expand(n, 2) + 0.02 * torch.randn(n, 2, generator=gen)


def test_flow_matching_reproduces_both_modes_where_mse_averages_them():
    from rlinf_model_mlp.model import MLPPolicy

    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(0)
    spec = EnvSpec({"state": ArraySpec((1,), "float32")}, ArraySpec((2,), "float32", -1.0, 1.0))
    flow = MLPPolicy({"name": "mlp", "head": "flow", "flow_steps": 10, "hidden_sizes": [64, 64],
                      "activation": "relu"}, spec)
    mse = MLPPolicy({"name": "mlp"}, spec)
    obs = {"state": torch.zeros(256, 1)}
    opt_f, opt_m = torch.optim.Adam(flow.parameters(), 3e-3), torch.optim.Adam(mse.parameters(), 3e-3)
    losses = []
    for step in range(600):
        demo = _two_modes(256, gen)
        loss = flow.imitation_loss(obs, demo)
        opt_f.zero_grad()
        loss.backward()
        opt_f.step()
        losses.append(float(loss.detach()))
        m = ((mse.mean_action(obs) - demo) ** 2).sum(-1).mean()
        opt_m.zero_grad()
        m.backward()
        opt_m.step()
    assert np.mean(losses[-50:]) < 0.6 * np.mean(losses[:20])  # the flow-matching loss falls
    with torch.no_grad():
        for deterministic in (True, False):
            a = flow.act({"state": torch.zeros(2000, 1)}, deterministic=deterministic).action[:, 0]
            near_pos, near_neg = float((a - 0.7).abs().lt(0.2).float().mean()), float((a + 0.7).abs().lt(0.2).float().mean())
            assert near_pos > 0.3 and near_neg > 0.3, (deterministic, near_pos, near_neg)
            assert float(a.abs().lt(0.3).float().mean()) < 0.1  # little mass between the modes
        assert float(mse.mean_action(obs)[:, 0].abs().max()) < 0.2  # the MSE head sits in between


@pytest.mark.parametrize("noise", ["noise", "sde"])
def test_a_checkpoint_reloads_the_same_flow_policy(tmp_path, noise):
    from rlinf_cli.policy import load_policy
    from rlinf_model_mlp.flow import CHAIN_KEY

    torch.manual_seed(0)
    policy = _policy(flow_noise=noise)
    with torch.no_grad():  # move the zero-initialised noise head off its start
        for p in policy.parameters():
            p.add_(0.05 * torch.randn_like(p))
    policy.save_pretrained(tmp_path / "ckpt")
    loaded = load_policy(tmp_path / "ckpt")
    assert loaded.cfg.head == "flow" and loaded.cfg.flow_noise == noise and loaded.action_chunk == 3
    obs = {"state": torch.randn(8, 3)}
    torch.manual_seed(5)
    a = policy.act(obs, deterministic=True)
    torch.manual_seed(5)
    b = loaded.act(obs, deterministic=True)
    torch.testing.assert_close(a.action, b.action, rtol=0, atol=0)
    chain = a.extras[CHAIN_KEY]
    torch.testing.assert_close(loaded.evaluate({**obs, CHAIN_KEY: chain}, a.action).logprob,
                               policy.evaluate({**obs, CHAIN_KEY: chain}, a.action).logprob, rtol=0, atol=0)
