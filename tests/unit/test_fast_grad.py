"""The MLP's fused Gaussian evaluate (``model.fast_grad``): outputs and gradients against autograd."""

from __future__ import annotations

import pytest
import torch

from rlinf_cli.api import TASK_KEY, ArraySpec, EnvSpec
from rlinf_cli.runtime.precision import onednn_bf16_matmuls
from rlinf_model_mlp.model import MLPPolicy

pytestmark = pytest.mark.numerics  # results depend on CPU features: make test-portable runs them again

CONT = EnvSpec({"state": ArraySpec((11,), "float32")}, ArraySpec((3,), "float32", -2.0, 1.0))
TASKS = EnvSpec({"state": ArraySpec((6,), "float32"), TASK_KEY: ArraySpec((), "int64")},
                ArraySpec((2,), "float32", -1.0, 1.0), tasks=("a", "b", "c"))
CASES = {
    "tanh": (CONT, {}),
    "relu": (CONT, {"activation": "relu"}),
    "three-layers": (CONT, {"hidden_sizes": [16, 24, 8]}),
    "no-critic": (CONT, {"critic": False}),
    "frozen-log-std": (CONT, {}),
    # the task embedding's gradient flows through the features: the fused node's input gradient
    "task-embedding": (TASKS, {"obs_keys": ["state", TASK_KEY]}),
}


def _policy(spec: EnvSpec, extra: dict, fast: bool) -> MLPPolicy:
    torch.manual_seed(0)
    policy = MLPPolicy({"hidden_sizes": [32, 32], "log_std_init": -0.3, **extra, "fast_grad": fast}, spec)
    with torch.no_grad():  # non-zero biases and a non-uniform std, so every term of the gradient shows
        for p in policy.parameters():
            p.add_(0.1 * torch.randn_like(p))
    return policy


def _batch(spec: EnvSpec, n: int = 64) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    obs = {k: (torch.randint(0, 3, (n,), generator=g) if k == TASK_KEY else 2 * torch.randn(n, *s.shape, generator=g))
           for k, s in spec.observation.items()}
    return obs, torch.randn(n, *spec.action.shape, generator=g)


def _grads(policy: MLPPolicy, obs: dict, action: torch.Tensor, use_logp: bool = True, use_value: bool = True):
    """Outputs and every parameter's gradient of a PPO-like loss of both heads and the entropy."""
    g = torch.Generator().manual_seed(2)
    w_logp, w_value = torch.randn(action.shape[0], generator=g), torch.randn(action.shape[0], generator=g)
    out = policy.evaluate(obs, action)
    loss = 0.01 * out.entropy.mean()
    if use_logp:
        loss = loss + (w_logp * out.logprob.exp()).mean()
    if use_value:
        loss = loss + ((out.value - w_value) ** 2).mean()
    policy.zero_grad(set_to_none=True)
    loss.backward()
    return out, {n: (None if p.grad is None else p.grad.clone()) for n, p in policy.named_parameters()}


@pytest.mark.parametrize("case", sorted(CASES))
def test_fused_evaluate_equals_autograd(case: str) -> None:
    spec, extra = CASES[case]
    fast, slow = _policy(spec, extra, True), _policy(spec, extra, False)
    if case == "frozen-log-std":
        for p in (fast, slow):
            p.set_action_std(0.7, trainable=False)
    assert fast._fast_grad and not slow._fast_grad
    obs, action = _batch(spec)
    out_f, grads_f = _grads(fast, obs, action)
    out_s, grads_s = _grads(slow, obs, action)
    # the forward runs the same ops: outputs agree bit for bit
    assert torch.equal(out_f.logprob, out_s.logprob) and torch.equal(out_f.value, out_s.value)
    assert torch.equal(out_f.entropy, out_s.entropy)
    assert out_f.logprob.grad_fn is not None and "GaussianEvaluate" in type(out_f.logprob.grad_fn).__name__
    assert grads_f.keys() == grads_s.keys()
    for name, gs in grads_s.items():
        gf = grads_f[name]
        assert (gf is None) == (gs is None), name
        if gs is not None:
            assert gs.abs().max() > 0, name  # the test exercises this gradient
            torch.testing.assert_close(gf, gs, rtol=1e-5, atol=1e-6, msg=name)
    if case == "frozen-log-std":
        assert grads_f["log_std"] is None
    if case == "task-embedding":
        assert grads_f["task_embed.weight"] is not None


@pytest.mark.parametrize("use_logp,use_value", [(True, False), (False, True)])
def test_fused_evaluate_with_one_head_unused(use_logp: bool, use_value: bool) -> None:
    """A critic warm-up trains the value alone; a loss without the value leaves the critic alone."""
    fast, slow = _policy(CONT, {}, True), _policy(CONT, {}, False)
    obs, action = _batch(CONT)
    _, grads_f = _grads(fast, obs, action, use_logp, use_value)
    _, grads_s = _grads(slow, obs, action, use_logp, use_value)
    for name, gs in grads_s.items():
        gf = grads_f[name]
        if gs is None or gs.abs().max() == 0:  # autograd's zeros or None: the fused node gives no gradient
            assert gf is None or gf.abs().max() == 0, name
        else:
            torch.testing.assert_close(gf, gs, rtol=1e-5, atol=1e-6, msg=name)


def test_fused_evaluate_steps_aside_where_it_does_not_apply() -> None:
    """No gradients wanted, mixed precision, squashed or discrete heads: autograd's path."""
    policy = _policy(CONT, {}, True)
    obs, action = _batch(CONT)
    with torch.no_grad():
        assert policy.evaluate(obs, action).logprob.grad_fn is None
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = policy.evaluate(obs, action)
    assert "GaussianEvaluate" not in type(out.logprob.grad_fn).__name__
    with onednn_bf16_matmuls():
        out = policy.evaluate(obs, action)
    assert "GaussianEvaluate" not in type(out.logprob.grad_fn).__name__
    squash = MLPPolicy({"hidden_sizes": [8], "squash": True}, CONT)
    disc = MLPPolicy({"hidden_sizes": [8]}, EnvSpec({"state": ArraySpec((4,), "float32")}, ArraySpec((), "int64"),
                                                   num_actions=3))
    assert not squash._fast_grad and not disc._fast_grad
