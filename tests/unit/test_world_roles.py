"""A world's roles: what `collectors.make` hands the stages, and the update reading runtime
batches instead of calling back into a rollout."""

from __future__ import annotations

import ast
from pathlib import Path
from types import SimpleNamespace

import torch

from rlinf_cli import collectors
from rlinf_cli.config import compose
from rlinf_cli.experience import Experience
from rlinf_cli.runtime.batches import SampleBatches

ROOT = Path(__file__).resolve().parents[2]


def test_make_returns_the_embodied_roles_with_their_settings_not_the_config():
    cfg = compose("rl", ["sim=gymnasium", "num_envs=3", "seed=7", "total_steps=123"])
    world = collectors.make(cfg, SimpleNamespace(device="cpu"))
    assert world.modality == "embodied" and world.unit == "steps"
    assert world.rollout.budget() == 123 and world.rollout.settings.num_envs == 3
    assert world.spec.num_actions == 2 and world.label
    for role in (world.policies, world.rollout, world.batches, world.evaluator, world.recorder):
        assert not hasattr(role, "cfg"), f"{type(role).__name__} holds the whole config"
    world.close()


def test_a_text_task_plugs_in_the_text_roles():
    cfg = compose("rl", ["sim=arithmetic", "model=hf", "text.iterations=5"])
    world = collectors.make(cfg, SimpleNamespace(device="cpu"))
    assert world.modality == "text" and world.unit == "iterations" and world.rollout.budget() == 5
    assert world.label == "arithmetic" and world.policies.normalizer is None
    assert type(world.batches).__name__ == "GroupBatches"


def test_the_update_imports_nothing_from_the_collectors():
    tree = ast.parse((ROOT / "rlinf_cli" / "runtime" / "update.py").read_text())
    modules = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    modules |= {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    assert not any(m and m.startswith("rlinf_cli.collectors") for m in modules), modules


def test_sample_batches_fill_each_minibatch_field_by_name():
    T, N = 4, 3
    exp = Experience({"state": torch.arange(T * N, dtype=torch.float32).reshape(T, N, 1)},
                     torch.arange(T * N).reshape(T, N), torch.full((T, N), -1.0), torch.full((T, N), 2.0),
                     torch.zeros(T, N), torch.zeros(T, N), torch.zeros(T, N), torch.ones(T, N), torch.zeros(N))
    adv, ret = torch.full((T, N), 3.0), torch.full((T, N), 4.0)
    algo = SimpleNamespace(minibatch_size=5, epochs=2)
    epochs = list(SampleBatches().epochs(exp, adv, ret, algo, torch.Generator().manual_seed(0)))
    assert len(epochs) == 2
    batches = list(epochs[0])
    assert [len(mb.actions) for mb in batches] == [5, 5, 2]
    mb = batches[0]
    assert torch.equal(mb.obs["state"].reshape(-1), mb.actions.float())  # rows stay aligned
    assert (mb.old_logprob == -1).all() and (mb.old_values == 2).all()
    assert (mb.advantages == 3).all() and (mb.returns == 4).all()
    assert mb.mask is None and mb.ref_logprob is None
