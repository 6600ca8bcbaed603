"""LeanAdam's flat-buffer step equals torch's Adam bit for bit, also when parameters sit out steps."""

from __future__ import annotations

import torch

from rlinf_cli.runtime.trainer import LeanAdam


def _pair() -> tuple[torch.nn.Module, torch.nn.Module]:
    torch.manual_seed(0)
    a = torch.nn.Sequential(torch.nn.Linear(5, 16), torch.nn.Tanh(), torch.nn.Linear(16, 3))
    b = torch.nn.Sequential(torch.nn.Linear(5, 16), torch.nn.Tanh(), torch.nn.Linear(16, 3))
    b.load_state_dict(a.state_dict())
    return a, b


def _run(model: torch.nn.Module, opt: torch.optim.Optimizer, steps: int, frozen_until: int) -> None:
    g = torch.Generator().manual_seed(1)
    for i in range(steps):
        x = torch.randn(8, 5, generator=g)
        opt.zero_grad(set_to_none=True)
        out = model(x)
        if i < frozen_until:  # like a critic warm-up: the first layer gets no gradient
            out = model[2](model[1](model[0](x).detach()))
        out.pow(2).mean().backward()
        opt.step()


def test_lean_adam_is_bit_identical_to_torch_adam() -> None:
    a, b = _pair()
    _run(a, torch.optim.Adam(a.parameters(), lr=1e-2, eps=1e-5), 12, 0)
    lean = LeanAdam(b.parameters(), lr=1e-2, eps=1e-5)
    _run(b, lean, 12, 0)
    assert lean._flat is not None  # the flat path really ran
    for pa, pb in zip(a.parameters(), b.parameters()):
        assert torch.equal(pa, pb)


def test_parameters_that_sat_out_steps_keep_their_own_adam_step() -> None:
    a, b = _pair()
    _run(a, torch.optim.Adam(a.parameters(), lr=1e-2), 8, 3)
    _run(b, LeanAdam(b.parameters(), lr=1e-2), 8, 3)
    for pa, pb in zip(a.parameters(), b.parameters()):
        assert torch.equal(pa, pb)
