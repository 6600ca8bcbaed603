"""An algorithm declares its optimizer settings (OptimSpec: eps, schedule, clip); the engine runs
exactly those and decides none of them."""

from __future__ import annotations

import pytest
import torch

from rlinf_cli.algorithm import ADAM_EPS, OptimSpec, linear_decay
from rlinf_cli.runtime.engine import make_engine


def _algorithms() -> dict[str, type]:
    from rlinf_algos.bc import BC
    from rlinf_algos.grpo import GRPO
    from rlinf_algos.ppo import PPO
    from rlinf_algos.reinforce_pp import ReinforcePP
    from rlinf_algos.rloo import RLOO
    from rlinf_algos.sac import SAC

    return {"ppo": PPO, "grpo": GRPO, "rloo": RLOO, "reinforce++": ReinforcePP, "sac": SAC, "bc": BC}


@pytest.mark.parametrize("name", ["ppo", "grpo", "rloo", "reinforce++", "sac", "bc"])
@pytest.mark.parametrize("anneal", [False, True])
def test_every_algorithm_declares_what_the_engine_used_to_hard_code(name: str, anneal: bool) -> None:
    """Adam's eps 1e-5, a linear decay to 0 exactly when anneal_lr is set, the config's clip and
    weight decay: the numbers every run had before the algorithm declared them."""
    algo = _algorithms()[name].from_config({"name": name, "anneal_lr": anneal, "lr": 2e-4})
    spec = algo.optim
    assert isinstance(spec, OptimSpec)
    assert spec.eps == ADAM_EPS == 1e-5 and spec.lr == 2e-4
    assert spec.schedule is (linear_decay if anneal else None)
    assert spec.max_grad_norm == algo.config.max_grad_norm
    assert spec.weight_decay == float(algo.config.weight_decay or 0.0)


def _policy() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))


def _grad_step(engine) -> torch.Tensor | None:
    loss = engine.module(torch.randn(16, 4, generator=torch.Generator().manual_seed(1))).pow(2).sum() * 100
    engine.backward(loss)
    return engine.step()


def test_the_engine_takes_eps_from_the_spec() -> None:
    engine = make_engine(_policy(), OptimSpec(lr=1e-3, eps=1e-3), {"backend": "torch"})
    assert engine.optimizer.param_groups[0]["eps"] == 1e-3
    engine = make_engine(_policy(), OptimSpec(lr=1e-3), {"backend": "torch"})
    assert engine.optimizer.param_groups[0]["eps"] == 1e-5


def test_the_engine_runs_the_declared_schedule_and_leaves_the_rate_alone_without_one() -> None:
    engine = make_engine(_policy(), OptimSpec(lr=1e-3, schedule=linear_decay), {"backend": "torch"})
    engine.schedule(0.25)
    assert engine.lr == 1e-3 * max(1.0 - 0.25, 0.0)  # the same float as the anneal it replaced
    engine.schedule(1.5)
    assert engine.lr == 0.0
    engine = make_engine(_policy(), OptimSpec(lr=1e-3, schedule=lambda done: 0.5 ** done), {"backend": "torch"})
    engine.schedule(2.0)
    assert engine.lr == 1e-3 * 0.25
    engine = make_engine(_policy(), OptimSpec(lr=1e-3), {"backend": "torch"})
    engine.set_lr(7e-4)  # e.g. a critic warm-up's own rate
    engine.schedule(0.5)
    assert engine.lr == 7e-4


@pytest.mark.parametrize("max_norm", [None, 0.5])
def test_the_engine_clips_exactly_when_declared(max_norm: float | None) -> None:
    engine = make_engine(_policy(), OptimSpec(lr=1e-3, max_grad_norm=max_norm), {"backend": "torch"})
    seen: list[float] = []
    engine.optimizer.register_step_pre_hook(lambda opt, *_: seen.append(
        float(torch.cat([p.grad.reshape(-1) for p in engine.params]).norm())))
    for _ in range(2):  # LeanAdam's first step (torch's) and a flat-buffer one
        norm = _grad_step(engine)
        if max_norm is None:
            assert norm is None and seen[-1] > 1.0
        else:
            assert float(norm) > max_norm and seen[-1] == pytest.approx(max_norm, rel=1e-5)
