"""The MLP policy's numpy acting path (``model.fast_act``) against its torch path."""

from __future__ import annotations

import pytest
import torch

from rlinf_cli.api import ArraySpec, EnvSpec
from rlinf_cli.runtime.optim import LeanAdam
from rlinf_model_mlp.fast_act import MAX_WORK
from rlinf_model_mlp.model import MLPPolicy

pytestmark = pytest.mark.numerics  # results depend on CPU features: make test-portable runs them again

CONT = EnvSpec({"state": ArraySpec((11,), "float32")}, ArraySpec((3,), "float32", -2.0, 1.0))
DISC = EnvSpec({"state": ArraySpec((4,), "float32")}, ArraySpec((), "int64"), num_actions=5)
TWO_KEYS = EnvSpec({"state": ArraySpec((5,), "float32"), "goal": ArraySpec((2, 2), "float32")},
                   ArraySpec((2,), "float32", -1.0, 1.0))
CASES = {
    "gaussian": (CONT, {}),
    "gaussian-relu-no-critic": (CONT, {"activation": "relu", "critic": False}),
    "squash": (CONT, {"squash": True, "q_heads": 2, "activation": "relu"}),
    "discrete": (DISC, {}),
    "two-keys": (TWO_KEYS, {"obs_keys": ["state", "goal"]}),
}


def _policy(spec: EnvSpec, extra: dict, **cfg) -> MLPPolicy:
    torch.manual_seed(0)
    return MLPPolicy({"hidden_sizes": [32, 32], **extra, **cfg}, spec)


def _obs(spec: EnvSpec, n: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    return {k: 3 * torch.randn(n, *s.shape, generator=g) for k, s in spec.observation.items()}


def _both(policy: MLPPolicy, obs: dict, deterministic: bool) -> tuple:
    """((numpy path's output, the RNG's next draws), (torch path's output, the RNG's next draws)),
    both from the same seed."""
    assert policy._fast_act is not None
    outs = []
    for fast in (True, False):
        keep = policy._fast_act
        policy._fast_act = keep if fast else None
        torch.manual_seed(7)
        with torch.no_grad():
            out = policy.act(obs, deterministic=deterministic)
        outs.append((out, torch.randn(4)))
        policy._fast_act = keep
    return outs[0], outs[1]


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("deterministic", [False, True])
def test_numpy_act_equals_torch_act(case: str, deterministic: bool) -> None:
    spec, extra = CASES[case]
    policy = _policy(spec, extra)
    obs = _obs(spec, 8)
    (fast, draw_fast), (slow, draw_slow) = _both(policy, obs, deterministic)
    assert torch.equal(draw_fast, draw_slow)  # the same random numbers were consumed
    assert fast.extras is None and slow.extras is None  # nothing to record beside a Gaussian action
    for a, b in zip(fast[:3], slow[:3]):
        assert a.dtype == b.dtype and a.shape == b.shape
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
    if spec.discrete:
        assert torch.equal(fast.action, slow.action)
    with torch.no_grad():
        assert policy._fast_act(obs, deterministic) is not None  # the numpy path is what ran


def test_numpy_act_follows_weight_updates() -> None:
    """An optimizer step (in place, or moving the storage as LeanAdam's flat buffers do) and a
    loaded state dict are seen by the next act."""
    policy = _policy(CONT, {})
    obs = _obs(CONT, 8)
    with torch.no_grad():
        before = policy.act(obs, deterministic=True)
    opt = LeanAdam(policy.parameters(), lr=0.1)
    for _ in range(2):  # the first step moves parameters into flat buffers, the second is in place
        out = policy.evaluate(obs, before.action)
        (out.logprob.sum() + out.value.sum()).backward()  # every parameter has a gradient: flat buffers
        opt.step()
        opt.zero_grad()
        (fast, _), (slow, _) = _both(policy, obs, deterministic=True)
        torch.testing.assert_close(fast.action, slow.action, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(fast.value, slow.value, rtol=1e-5, atol=1e-5)
        assert (fast.action - before.action).abs().max() > 1e-3
    # the case above did move the storage: the parameters are views of LeanAdam's flat buffer now
    assert opt._flat is not None and next(policy.parameters()).data_ptr() == opt._flat["param"].data_ptr()
    other = _policy(CONT, {})
    with torch.no_grad():
        for p in other.parameters():
            p.add_(0.5)
    policy.load_state_dict(other.state_dict())
    fast, _ = _both(policy, obs, deterministic=True)[0]
    with torch.no_grad():
        other._fast_act = None
        expected = other.act(obs, deterministic=True)
    torch.testing.assert_close(fast.action, expected.action, rtol=1e-5, atol=1e-5)


def test_torch_path_where_numpy_does_not_apply() -> None:
    policy = _policy(CONT, {})
    fast = policy._fast_act
    small = _obs(CONT, 8)
    with torch.no_grad():
        assert fast(small, False) is not None
        rows = MAX_WORK // 32 ** 2 + 1
        assert fast(_obs(CONT, rows), False) is None  # past the work limit torch's kernels win
    assert fast(small, False) is None  # gradients wanted: autograd needs the torch graph
    out = policy.act(small)
    assert out.logprob.requires_grad
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        assert fast(small, False) is None
    assert _policy(CONT, {}, fast_act=False)._fast_act is None
    assert _policy(CONT, {}, activation="gelu")._fast_act is None  # no exact numpy gelu here
    pixels = EnvSpec({"rgb": ArraySpec((16, 16, 3), "uint8", 0, 255)}, ArraySpec((2,), "float32", -1.0, 1.0))
    assert _policy(pixels, {"obs_keys": ["rgb"], "cnn_channels": [4], "cnn_kernels": [4], "cnn_strides": [2],
                            "cnn_features": 8})._fast_act is None
    policy.double()  # float64 weights: numpy views would not be float32
    with torch.no_grad():
        assert fast({"state": small["state"].double()}, False) is None
