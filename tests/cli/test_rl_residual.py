"""Residual RL on a clone (`rlinf rl init=<clone> init_residual=true`, ``Policy.residual``): the
clone is frozen as a base and RL trains a correction added to its actions.

What must hold: the residual policy starts as exactly the clone (same actions, same log-probs, on
the fast and the plain paths); training moves the correction and never the base; a residual
checkpoint saves, loads, evaluates and resumes as any other; through the CLI the run's first
validation scores what the clone scores on the same seeds, and the base in every checkpoint is the
clone's actor; inputs that cannot work are refused in one line (no init=, a model or checkpoint
that cannot learn a residual).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from rlinf_cli.api import ArraySpec, EnvSpec, UserError

# the CLI test compares a run's validation with an evaluation of the clone: results that depend on CPU
# features, so make test-portable runs the file again
pytestmark = pytest.mark.numerics

PENDULUM = ["sim=gymnasium", "sim.env_id=Pendulum-v1", "progress=false", "tracking.enabled=false"]
SPEC = EnvSpec({"state": ArraySpec((5,), "float32")}, ArraySpec((3,), "float32", low=-1.0, high=1.0),
               max_episode_steps=10)


def _clone(**model) -> "torch.nn.Module":
    from rlinf_model_mlp.model import MLPPolicy

    torch.manual_seed(0)
    policy = MLPPolicy({"name": "mlp", "hidden_sizes": [16, 16], **model}, SPEC)
    with torch.no_grad():  # a clone whose mean is far from the fresh head's near-zero output
        policy.actor_layers[-1].weight.normal_(0.0, 0.5)
        policy.actor_layers[-1].bias.normal_(0.0, 0.5)
        policy.log_std.fill_(-1.0)
    return policy


def _obs(n: int = 6) -> dict[str, torch.Tensor]:
    return {"state": torch.randn(n, 5, generator=torch.Generator().manual_seed(1))}


@pytest.mark.parametrize("fast", [True, False])
def test_a_residual_policy_starts_as_exactly_its_clone(fast):
    clone = _clone(fast_act=fast, fast_grad=fast)
    res = clone.residual()
    obs = _obs()
    torch.testing.assert_close(res.act(obs, deterministic=True).action, clone.act(obs, deterministic=True).action)
    actions = torch.randn(6, 3, generator=torch.Generator().manual_seed(2))
    with torch.enable_grad():
        got, want = res.evaluate(obs, actions), clone.evaluate(obs, actions)
    torch.testing.assert_close(got.logprob, want.logprob)
    torch.testing.assert_close(got.value, want.value)  # the critic carried over
    torch.testing.assert_close(res.mean_action(obs), clone.mean_action(obs))
    sampled = res.act(obs)  # a sample's recorded log-prob is the one evaluate recomputes
    torch.testing.assert_close(sampled.logprob, res.evaluate(obs, sampled.action).logprob)


def test_training_moves_the_correction_and_never_the_base():
    clone = _clone()
    res = clone.residual()
    base = {k: v.clone() for k, v in res.base.state_dict().items()}
    trainable = [p for p in res.parameters() if p.requires_grad]
    assert not any(p.requires_grad for p in res.base.parameters())
    opt = torch.optim.Adam(trainable, lr=1e-2)
    obs, target = _obs(32), torch.full((32, 3), 0.5)
    for _ in range(20):  # raise the log-prob of one action everywhere: the mean must move towards it
        loss = -res.evaluate(obs, target).logprob.mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    for k, v in res.base.state_dict().items():
        assert torch.equal(v, base[k]), k
    before = (clone.mean_action(obs) - target).abs().mean()
    after = (res.mean_action(obs) - target).abs().mean()
    assert after < 0.8 * before, (float(before), float(after))
    sampled = res.act(obs)  # still consistent after training, where the correction is not zero
    torch.testing.assert_close(sampled.logprob, res.evaluate(obs, sampled.action).logprob)


def test_a_residual_checkpoint_round_trips(tmp_path):
    from rlinf_cli.policy import load_policy

    res = _clone().residual()
    with torch.no_grad():
        res.actor_layers[-1].bias.add_(0.3)  # a correction that is not zero
    res.save_pretrained(tmp_path / "ckpt")
    loaded = load_policy(tmp_path / "ckpt")
    obs = _obs()
    assert loaded.base is not None
    torch.testing.assert_close(loaded.act(obs, deterministic=True).action, res.act(obs, deterministic=True).action)
    with pytest.raises(UserError, match="already learns a residual"):
        loaded.residual()


def test_models_that_cannot_learn_a_residual_say_so():
    from rlinf_model_mlp.model import MLPPolicy

    squashed = MLPPolicy({"name": "mlp", "hidden_sizes": [8], "squash": True, "q_heads": 2}, SPEC)
    assert squashed.residual() is None
    discrete = MLPPolicy({"name": "mlp", "hidden_sizes": [8]},
                         EnvSpec({"state": ArraySpec((5,), "float32")}, ArraySpec((), "int64"), num_actions=3))
    assert discrete.residual() is None


def _rows(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_residual_rl_through_the_cli(cli_proc, workdir):
    """A short PPO run makes the 'clone'; residual PPO from it validates at iteration 0 exactly as
    the clone evaluates on those seeds, keeps the clone's actor as the base of every checkpoint, and
    its checkpoint evaluates and resumes."""
    from safetensors.torch import load_file

    small = ["algo=ppo", "num_envs=2", "algo.rollout_steps=32", "algo.minibatch_size=32", "algo.epochs=2",
             "model.hidden_sizes=[16,16]", *PENDULUM]
    res = cli_proc("rl", *small, "total_steps=128", "eval.episodes=0", "run_dir=clone")
    assert res.code == 0, res.err[-3000:]
    clone = workdir / "clone/checkpoints/final"
    res = cli_proc("rl", *small, f"init={clone}", "init_residual=true", "algo.critic_warmup_iters=1", "total_steps=256", "eval.episodes=2",
                   "eval.interval=2", "eval.val_episodes=2", "eval.best_p=null", "checkpoint.interval=2", "run_dir=res")
    assert res.code == 0, res.err[-3000:]
    assert "residual RL: the clone is frozen" in " ".join(res.err.split())
    first = next(r for r in _rows(workdir / "res") if "val/return_mean" in r)
    assert first["iteration"] == 0
    ev = cli_proc("eval", f"checkpoint={clone}", "episodes=2", "seed=2000000", "num_envs=2", "tracking.enabled=false",
                  "run_dir=ev")
    assert ev.code == 0, ev.err[-3000:]
    # the same actions up to rounding (batches of another size may round the last bit otherwise);
    # a correction that did not start at zero would move Pendulum's return by far more
    assert ev.json_tail()["return_mean"] == pytest.approx(first["val/return_mean"], rel=1e-4)
    want = load_file(str(clone / "model.safetensors"))
    for ckpt in ("final", "best", "iter_000002"):
        got = load_file(str(workdir / "res/checkpoints" / ckpt / "model.safetensors"))
        for k, v in want.items():
            if k.startswith("actor."):
                assert torch.equal(got["base." + k], v), (ckpt, k)
    trained = load_file(str(workdir / "res/checkpoints/final/model.safetensors"))
    assert not torch.equal(trained["actor.4.bias"], torch.zeros_like(trained["actor.4.bias"]))  # the correction learned
    ev = cli_proc("eval", f"checkpoint={workdir / 'res/checkpoints/final'}", "episodes=2", "num_envs=2",
                  "tracking.enabled=false", "run_dir=ev2")
    assert ev.code == 0, ev.err[-3000:]
    res = cli_proc("rl", f"resume={workdir / 'res/checkpoints/iter_000002'}", "run_dir=resumed")
    assert res.code == 0, res.err[-3000:]
    assert "residual RL" not in res.err  # a resumed run is residual already: nothing is converted again


def test_residual_rl_refusals(cli_proc, workdir):
    res = cli_proc("rl", *PENDULUM, "init_residual=true", "run_dir=a")
    assert res.code == 2 and "Traceback" not in res.err and not Path("a").exists()
    assert "set init=<checkpoint>" in res.err
    res = cli_proc("rl", *PENDULUM, "algo=sac", "num_envs=1", "algo.rollout_steps=8", "algo.minibatch_size=8",
                   "algo.buffer_size=100", "algo.warmup_steps=8", "model.hidden_sizes=[8,8]", "total_steps=8",
                   "eval.episodes=0", "run_dir=sac")
    assert res.code == 0, res.err[-3000:]
    res = cli_proc("rl", *PENDULUM, "algo=sac", f"init={workdir / 'sac/checkpoints/final'}", "init_residual=true",
                   "run_dir=b")
    assert res.code == 2 and "Traceback" not in res.err and not Path("b").exists()
    assert "cannot learn a residual on this checkpoint" in " ".join(res.err.split())
