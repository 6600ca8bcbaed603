"""Demonstrations beside on-policy RL (`rlinf rl --algo ppo algo.bc_coef=...`, DAPG-style): every
minibatch's loss gains an imitation loss on as many demonstrated steps, drawn from ``demos=`` or,
by default, from the dataset the ``init=`` clone was trained on.

What must hold: the clone's own dataset is found without being named; the term moves the policy
towards the demonstrations (a run where it dominates clones the expert from a random start);
inputs that cannot work are refused in one line before any work (demos= with no imitation weight,
an imitation weight with nothing to imitate, mse on discrete actions); a run that normalizes its
observations imitates the demonstrations normalized as its policy reads them.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import cartpole_clone

QUIET = ["progress=false", "tracking.enabled=false"]


@pytest.fixture(scope="module")
def clone(tmp_path_factory) -> Path:
    """CartPole: 4 expert episodes (``demos``) and a policy cloned from them (``sft``)."""
    root = tmp_path_factory.mktemp("demos")
    cartpole_clone(root, sft_epochs=10)
    return root


def _rows(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


SHORT = ["num_envs=2", "algo.rollout_steps=32", "algo.epochs=2", "algo.minibatch_size=32", "eval.episodes=0",
         "eval.best=false", *QUIET]


def test_a_clone_imitates_its_own_dataset_beside_ppo(cli, clone):
    """init= a clone written by `rlinf sft`: its dataset is the default demos=, and the term is reported."""
    res = cli("rl", f"init={clone / 'sft/checkpoints/best'}", "algo.bc_coef=0.5", "algo.bc_loss=nll",
              "algo.critic_warmup_iters=1", "total_steps=192", *SHORT, "run_dir=run")
    assert res.code == 0, res.err[-3000:]
    assert f"from {clone / 'demos'}" in " ".join(res.err.split()), res.err[-2000:]
    rows = [r for r in _rows(Path("run")) if "train/policy_loss" in r]
    assert len(rows) == 3  # iteration 1 trains the critic alone: no demonstrations drawn
    assert "train/demo_loss" not in rows[0] or rows[0]["train/demo_loss"] != rows[0]["train/demo_loss"]
    assert all(0 < r["train/demo_loss"] < 1.0 for r in rows[1:]), rows  # NLL of the expert's actions under a clone


@pytest.mark.learning
def test_the_imitation_term_clones_the_expert_from_a_random_start(cli, clone, learning):
    """PPO from scratch with demos= and an imitation weight that dominates its loss: the negative
    log-likelihood of the expert's actions falls from a random policy's (ln 2 for CartPole's two
    actions) to about half of it (0.44-0.52 of the start at seeds 0-3, 2026-12-07), and below
    where the same run with a negligible weight (1e-6, the loss still measured) ends: PPO alone
    went to 2.3x and 0.7x of the start at seeds 0 and 1."""
    common = ["total_steps=1024", "algo.lr=3e-3", "algo.anneal_lr=false", "algo.bc_loss=nll", *SHORT]

    def demo_loss(seed: int, weight: str) -> list[float]:
        run = f"s{seed}-{weight}"
        res = cli("rl", f"demos={clone / 'demos'}", f"algo.bc_coef={weight}", f"seed={seed}", *common, f"run_dir={run}")
        assert res.code == 0, res.err[-3000:]
        got = [r["train/demo_loss"] for r in _rows(Path(run)) if "train/demo_loss" in r]
        assert len(got) == 16 and got[0] > 0.55, got  # ln 2 = 0.69 at the start
        return got

    for seed in (learning.seed, learning.seed + 1):
        with_term, control = demo_loss(seed, "20"), demo_loss(seed, "1e-6")
        end, end_control = sum(with_term[-3:]) / 3, sum(control[-3:]) / 3
        learning.record(1 - end / with_term[0], 0.3, control=1 - end_control / control[0])
        assert end < 0.7 * with_term[0] and end < end_control, (seed, with_term, control)


def test_demonstrations_are_normalized_as_the_run_normalizes(cli, clone):
    """A run that normalizes observations (env.normalize_obs) imitates the demonstrations as its
    policy sees them: each draw goes through the run's statistics of that moment, which it leaves
    as they were."""
    import numpy as np
    import torch

    from rlinf_cli.collectors.datasets import EpisodeDataset
    from rlinf_cli.runtime.normalize import NormalizeConfig, Normalizer

    data = EpisodeDataset(str(clone / "demos"), 0.0, 0, "cpu")
    norm = Normalizer(data.spec, NormalizeConfig(obs=True), 2)
    norm.observe({k: np.asarray(v[:40]) for k, v in data.data.obs.items()})  # statistics of some steps
    stats = {k: (r.mean.copy(), r.count) for k, r in norm.obs_rms.items()}
    raw = data.sample(16, torch.Generator().manual_seed(1))
    data.normalize_with(norm)
    seen = data.sample(16, torch.Generator().manual_seed(1))
    want = norm.observe({k: raw.obs[k].numpy() for k in norm.keys}, update=False)
    assert norm.keys and all(np.allclose(seen.obs[k].numpy(), want[k]) for k in norm.keys)
    assert not all(np.allclose(seen.obs[k].numpy(), raw.obs[k].numpy()) for k in norm.keys)
    assert torch.equal(seen.actions, raw.actions)
    assert all((r.mean == stats[k][0]).all() and r.count == stats[k][1] for k, r in norm.obs_rms.items())

    res = cli("rl", f"demos={clone / 'demos'}", "algo.bc_coef=1.0", "algo.bc_loss=nll", "env.normalize_obs=true",
              *SHORT, "total_steps=128", "run_dir=run")
    assert res.code == 0, res.err[-3000:]
    assert "normalized as the run's" in res.err, res.err[-2000:]
    losses = [r["train/demo_loss"] for r in _rows(Path("run")) if "train/policy_loss" in r]
    assert losses and all(0 < x < 5 for x in losses), losses


def test_inputs_that_cannot_work_are_refused_in_one_line(cli, clone):
    res = cli("rl", f"demos={clone / 'demos'}", *SHORT, "total_steps=64", "run_dir=a")  # bc_coef=0
    assert res.code == 2 and "imitation term" in res.err and "Traceback" not in res.err
    res = cli("rl", "algo.bc_coef=0.5", "algo.bc_loss=nll", *SHORT, "total_steps=64", "run_dir=b")  # no demos, no clone
    assert res.code == 2 and "set demos=<dataset>" in " ".join(res.err.split()) and "Traceback" not in res.err
    res = cli("rl", f"demos={clone / 'demos'}", "algo.bc_coef=0.5", *SHORT, "total_steps=64", "run_dir=c")  # mse
    assert res.code == 2 and "algo.bc_loss=nll" in res.err and "Traceback" not in res.err
    res = cli("rl", "algo.bc_loss=huber", *SHORT, "total_steps=64", "run_dir=d")
    assert res.code == 2 and "bc_loss" in res.err and "Traceback" not in res.err
    assert not any(Path(d).exists() for d in "abcd")
