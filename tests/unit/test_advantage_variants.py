"""RLOO and REINFORCE++: advantage formulas, config checks, and an embodied run through the CLI."""

from __future__ import annotations

import pytest

import torch

from rlinf_algos.grpo import GRPO, group_advantages  # noqa: E402
from rlinf_algos.reinforce_pp import ReinforcePP, batch_normalised_advantages  # noqa: E402
from rlinf_algos.rloo import RLOO, leave_one_out_advantages  # noqa: E402
from rlinf_cli.errors import UserError  # noqa: E402

pytestmark = pytest.mark.numerics  # results depend on CPU features: make test-portable runs them again


def test_rloo_matches_a_loop():
    returns = torch.tensor([1.0, 0.0, 0.0, 1.0, 3.0, 5.0, 7.0, 9.0])
    G = 4
    expected = []
    for i, r in enumerate(returns.tolist()):
        g = i // G
        others = [x for j, x in enumerate(returns.tolist()) if j // G == g and j != i]
        expected.append(r - sum(others) / len(others))
    assert torch.allclose(leave_one_out_advantages(returns, G), torch.tensor(expected))
    assert torch.allclose(RLOO.from_config({"group_size": 4}).outcome_advantages(returns), torch.tensor(expected))


def test_reinforce_pp_normalises_over_the_batch():
    returns = torch.tensor([1.0, 0.0, 1.0, 1.0, 0.0, 0.0, 0.0, 1.0])
    adv = batch_normalised_advantages(returns, 4, group_baseline=True)
    centred = returns.reshape(2, 4) - returns.reshape(2, 4).mean(1, keepdim=True)
    assert torch.allclose(adv, centred.reshape(-1) / (centred.std() + 1e-6))
    plain = batch_normalised_advantages(returns, 1, group_baseline=False)
    assert abs(float(plain.mean())) < 1e-6 and abs(float(plain.std()) - 1.0) < 1e-4
    # one sample per group is allowed without the group baseline, refused with it
    assert ReinforcePP.from_config({"group_size": 1, "group_baseline": False}).config.group_size == 1
    with pytest.raises(UserError, match="group_size must be >= 2"):
        ReinforcePP.from_config({"group_size": 1})


def test_variants_differ_from_grpo_only_in_advantages():
    returns = torch.tensor([1.0, 0.0, 0.0, 0.0])
    grpo = GRPO.from_config({"group_size": 4}).outcome_advantages(returns)
    assert torch.allclose(grpo, group_advantages(returns, 4))
    assert RLOO.loss is GRPO.loss and ReinforcePP.loss is GRPO.loss
    # with one success in four, RLOO's advantage is R - mean(others) = 1 and -1/3
    assert torch.allclose(RLOO.from_config({"group_size": 4}).outcome_advantages(returns),
                          torch.tensor([1.0, -1 / 3, -1 / 3, -1 / 3]))


def test_filter_groups_keeps_informative_groups():
    algo = GRPO.from_config({"group_size": 2, "filter_groups": True})
    keep = algo.filter_groups(torch.tensor([1.0, 1.0, 0.0, 1.0, 0.0, 0.0]))
    assert keep.tolist() == [False, True, False]


@pytest.mark.parametrize("algo", ["rloo", "reinforce++"])
def test_embodied_run_with_variant(cli, algo):
    r = cli("rl", "--algo", algo, "sim.env_id=CartPole-v1", "total_steps=600", "algo.groups=2", "algo.group_size=4",
            "eval.episodes=2", "tracking.enabled=false", "progress=false")
    assert r.code == 0, r.err
    assert "final" in r.err  # the run finished and wrote its final checkpoint
