"""The model scaffold (`rlinf plugins new NAME --kind model`) as a plugin author gets it: it trains
on a simulator whose observations include a text entry (Meta-World's instruction) and on CartPole,
and PPO's critic warm-up trains its value head (declared through ``critic_parameters``), not a
guess from parameter names.

The scaffold is imported from its directory and registered in this process's registry, as pip
would register it, without installing anything.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

NAME = "demo_scaffold"


@pytest.fixture
def scaffold(workdir: Path, monkeypatch: pytest.MonkeyPatch):
    """The scaffolded model package, registered as model ``demo_scaffold``; returns its ``Model``."""
    from rlinf_cli.registry import Spec, get_registry
    from rlinf_cli.scaffold import new_plugin

    path = new_plugin(NAME, "model", workdir / "plugins")
    monkeypatch.syspath_prepend(str(path))
    package = path.name.replace("-", "_")
    plugin = __import__(f"{package}.plugin", fromlist=["x"])
    reg = get_registry()
    specs: list[Spec] = []
    plugin.register_models(register=lambda name, factory, **kw: specs.append(
        Spec("model", name, factory, kw.get("summary", ""), False, path.name, "0.1.0", path / package / "conf")))
    monkeypatch.setitem(reg._specs["model"], NAME, specs[0])
    yield specs[0].load()
    for mod in [m for m in sys.modules if m == package or m.startswith(package + ".")]:
        monkeypatch.delitem(sys.modules, mod)


TINY = ["num_envs=2", "algo.rollout_steps=16", "algo.minibatch_size=16", "algo.epochs=2", "tracking.enabled=false",
        "progress=false", "seed=0"]


@pytest.mark.parametrize("sim", [["sim=metaworld", "sim.task=reach-v3", "sim.max_episode_steps=20"],
                                 ["sim.env_id=CartPole-v1"]], ids=["metaworld", "cartpole"])
def test_scaffolded_model_trains_and_evaluates(sim, scaffold, cli, workdir):
    """Meta-World's observations carry the instruction text (a numpy object array, not a tensor):
    the scaffold reads only the numeric entries it declares, so it trains there as on CartPole."""
    res = cli("rl", *sim, f"model={NAME}", *TINY, "total_steps=64", "eval.episodes=2", "run_dir=rl")
    assert res.code == 0, res.err
    state = json.loads((workdir / "rl/checkpoints/final/trainer_state.json").read_text())
    assert state["iteration"] == 2
    from rlinf_cli.policy import load_policy

    policy = load_policy(workdir / "rl/checkpoints/final")
    assert type(policy).__name__ == "Model"
    spec = policy.env_spec
    assert policy.observation_keys and all(not spec.observation[k].is_text for k in policy.observation_keys)
    if sim[0] == "sim=metaworld":
        assert "instruction" in spec.observation and "instruction" not in policy.observation_keys
    res = cli("eval", *sim, "checkpoint=rl/checkpoints/final", "episodes=2", "tracking.enabled=false",
              "progress=false", "run_dir=ev")
    assert res.code == 0, res.err


def test_scaffold_refuses_a_text_entry_in_its_keys(scaffold):
    from rlinf_cli.api import ArraySpec, EnvSpec
    from rlinf_cli.errors import UserError

    spec = EnvSpec({"state": ArraySpec((3,), "float32"), "instruction": ArraySpec((), "str")},
                   ArraySpec((2,), "float32", -1.0, 1.0))
    assert scaffold({"name": NAME}, spec).observation_keys == ("state",)
    with pytest.raises(UserError, match="instruction.*text"):
        scaffold({"name": NAME, "obs_keys": ["state", "instruction"]}, spec)
    with pytest.raises(UserError, match="nope"):
        scaffold({"name": NAME, "obs_keys": ["nope"]}, spec)


def test_critic_warm_up_trains_the_scaffolds_value_head_alone(scaffold, cli, workdir):
    """PPO after init= trains the critic alone for algo.critic_warmup_iters iterations. The
    scaffold's value head is ``v`` (no ``critic.`` in its name): it moves, the actor does not."""
    from safetensors.torch import load_file

    res = cli("rl", "sim.env_id=CartPole-v1", f"model={NAME}", *TINY, "total_steps=32", "eval.episodes=0",
              "run_dir=start")
    assert res.code == 0, res.err
    res = cli("rl", "sim.env_id=CartPole-v1", "init=start/checkpoints/final", *TINY, "total_steps=64",
              "algo.critic_warmup_iters=5", "eval.episodes=0", "run_dir=warm")
    assert res.code == 0, res.err
    before = load_file(str(workdir / "start/checkpoints/final/model.safetensors"))
    after = load_file(str(workdir / "warm/checkpoints/final/model.safetensors"))
    moved = {k for k in before if not torch.equal(before[k], after[k])}
    assert moved == {"v.weight", "v.bias"}, moved
    rows = [json.loads(line) for line in (workdir / "warm/metrics.jsonl").read_text().splitlines()]
    iterations = [r for r in rows if "train/value_loss" in r]
    assert len(iterations) == 2 and all(r.get("train/grad_norm", 0.0) > 0 for r in iterations), rows  # was 0.0


def test_warm_up_of_a_model_that_declares_no_critic_is_refused(scaffold, cli, workdir, monkeypatch):
    """A model that declares no critic parameters (the Policy default) cannot be warmed up: one
    line before anything runs, not iterations that silently train nothing."""
    from rlinf_cli.policy import Policy

    res = cli("rl", "sim.env_id=CartPole-v1", f"model={NAME}", *TINY, "total_steps=32", "eval.episodes=0",
              "run_dir=start")
    assert res.code == 0, res.err
    monkeypatch.setattr(scaffold, "critic_parameters", Policy.critic_parameters)
    res = cli("rl", "sim.env_id=CartPole-v1", "init=start/checkpoints/final", *TINY, "total_steps=64",
              "run_dir=warm")
    assert res.code == 2
    assert "declares no critic parameters" in res.err and "critic_parameters()" in res.err, res.err
    assert "Traceback" not in res.err and len(res.err.strip().splitlines()) == 1, res.err
    assert not (workdir / "warm").exists()
    # without a warm-up the same model trains (the error is about the warm-up, not the model)
    res = cli("rl", "sim.env_id=CartPole-v1", "init=start/checkpoints/final", *TINY, "total_steps=32",
              "algo.critic_warmup_iters=0", "eval.episodes=0", "run_dir=nowarm")
    assert res.code == 0, res.err


def test_update_refuses_a_critic_only_phase_with_no_critic_parameters() -> None:
    """The update itself (any caller, not only `rlinf rl`) refuses rather than stepping nothing."""
    from rlinf_algos.ppo import PPO
    from rlinf_cli.api import ArraySpec, EnvSpec
    from rlinf_cli.runtime.batches import SampleBatches
    from rlinf_cli.errors import UserError
    from rlinf_cli.experience import Experience
    from rlinf_cli.policy import Policy
    from rlinf_cli.runtime.engine import make_engine
    from rlinf_cli.runtime.update import update
    from rlinf_model_mlp.model import MLPPolicy

    class Undeclared(MLPPolicy):
        critic_parameters = Policy.critic_parameters

    spec = EnvSpec({"state": ArraySpec((3,), "float32")}, ArraySpec((2,), "float32", -1.0, 1.0))
    policy = Undeclared({"name": "mlp", "hidden_sizes": [8]}, spec)
    T, N = 4, 2
    obs = {"state": torch.randn(T, N, 3)}
    with torch.no_grad():
        out = policy.act({"state": obs["state"].reshape(T * N, 3)})
    exp = Experience(obs, out.action.reshape(T, N, 2), out.logprob.reshape(T, N), out.value.reshape(T, N),
                     torch.randn(T, N), torch.zeros(T, N), torch.zeros(T, N), torch.ones(T, N), torch.zeros(N))
    algo = PPO.from_config({"name": "ppo", "epochs": 1, "minibatch_size": 8})
    engine = make_engine(policy, algo.optim, {"backend": "torch"})
    with pytest.raises(UserError, match="declares no critic parameters"):
        update(engine, algo, exp, SampleBatches(),
               torch.Generator().manual_seed(0), critic_only=True)
