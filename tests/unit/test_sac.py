"""SAC on the `transitions` rollout kind: the replay buffer, learning Pendulum, exact resume (the
buffer is in the checkpoint), RL from demonstrations, and bad input."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch

from rlinf_cli.api import ArraySpec, EnvSpec
from tests.conftest import RLINF

pytestmark = pytest.mark.numerics  # results depend on CPU features: make test-portable runs them again

PENDULUM = ["sim=gymnasium", "sim.env_id=Pendulum-v1", "algo=sac", "tracking.enabled=false", "progress=false"]


def _run(*args: str, timeout: int = 600) -> subprocess.CompletedProcess:
    res = subprocess.run([RLINF, *args], capture_output=True, text=True, timeout=timeout)
    assert res.returncode == 0, res.stderr[-3000:]
    return res


def _metrics(run_dir: Path) -> list[dict]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if not (k.startswith("time/") or k.endswith("_s"))} for r in rows]


def test_replay_buffer_ring_keeps_dtypes_and_bounds_memory():
    from rlinf_cli.errors import UserError
    from rlinf_cli.runtime.replay import ReplayBuffer

    spec = EnvSpec(observation={"state": ArraySpec((2,), "float32"), "rgb": ArraySpec((4, 4, 3), "uint8")},
                   action=ArraySpec((1,), "float32", low=-1.0, high=1.0), max_episode_steps=5)
    buf = ReplayBuffer(spec, ["state", "rgb"], capacity=5)
    assert buf.obs["rgb"].dtype == np.uint8  # pixels are not widened
    for i in range(7):  # two past capacity: the two oldest are overwritten
        o = {"state": np.full((1, 2), i, np.float32), "rgb": np.full((1, 4, 4, 3), i, np.uint8)}
        n = {"state": np.full((1, 2), i + 0.5, np.float32), "rgb": np.full((1, 4, 4, 3), i + 1, np.uint8)}
        buf.add(o, np.full((1, 1), i, np.float32), np.array([float(i)], np.float32), n, np.array([i == 3]))
    assert len(buf) == 5 and buf.added == 7
    assert sorted(buf.rewards.tolist()) == [2.0, 3.0, 4.0, 5.0, 6.0]
    batch = buf.sample(64, torch.Generator().manual_seed(0))
    np.testing.assert_array_equal(batch["next_obs"]["state"][:, 0], batch["rewards"] + 0.5)  # rows stay aligned
    assert batch["terminated"][batch["rewards"] == 3.0].all() and not batch["terminated"][batch["rewards"] != 3.0].any()
    other = ReplayBuffer(spec, ["state", "rgb"], capacity=5)
    assert other.load(buf.state())
    for k in ("actions", "rewards", "terminated"):
        np.testing.assert_array_equal(getattr(other, k), getattr(buf, k))
    assert (other.pos, other.size, other.added) == (buf.pos, buf.size, buf.added)
    with pytest.raises(UserError, match="GiB"):
        ReplayBuffer(spec, ["state", "rgb"], capacity=10**12)  # refused up front, not hours in


def test_squashed_actor_log_prob_matches_a_change_of_variables():
    """The tanh-squashed Gaussian's log-prob of an action (evaluate) equals the one act() reports."""
    from rlinf_cli.registry import get_registry

    spec = EnvSpec(observation={"state": ArraySpec((3,), "float32")},
                   action=ArraySpec((2,), "float32", low=-2.0, high=2.0), max_episode_steps=5)
    torch.manual_seed(0)
    model = get_registry().load("model", "mlp")({"name": "mlp", "squash": True, "q_heads": 2, "critic": False}, spec)
    obs = {"state": torch.randn(256, 3)}
    out = model.act(obs)
    assert out.action.abs().max() <= 2.0  # inside the bounds without clipping
    torch.testing.assert_close(model.evaluate(obs, out.action).logprob, out.logprob, rtol=1e-3, atol=1e-3)
    q = model.q_values(obs, out.action)
    assert q.shape == (2, 256)
    before = [p.clone() for p in model.q_target.parameters()]
    model.update_targets(0.5)
    moved = [p for p, b in zip(model.q_target.parameters(), before) if not torch.equal(p, b)]
    assert not moved  # targets start equal to the online heads
    with torch.no_grad():
        for p in model.q.parameters():
            p.add_(1.0)
    model.update_targets(0.25)
    for t, b in zip(model.q_target.parameters(), before):
        torch.testing.assert_close(t, b + 0.25)


def test_sample_log_prob_and_gradients_equal_the_change_of_variables_form():
    """sample()'s regrouped log-prob (noise in place of (u - mean) / std, constants folded) is the
    change-of-variables log-prob, in value and in the gradients SAC's actor loss takes; asymmetric
    bounds exercise the constants; evaluate() of the sampled action agrees too."""
    from rlinf_cli.registry import get_registry

    spec = EnvSpec(observation={"state": ArraySpec((5,), "float32")},
                   action=ArraySpec((3,), "float32", low=-3.0, high=1.0), max_episode_steps=5)
    torch.manual_seed(0)
    model = get_registry().load("model", "mlp")({"name": "mlp", "squash": True, "q_heads": 2, "critic": False,
                                                 "hidden_sizes": [32, 32], "activation": "relu"}, spec)
    obs = {"state": torch.randn(64, 5)}
    torch.manual_seed(1)
    action, logp = model.sample(obs)
    torch.manual_seed(1)
    mean, log_std = model._squashed(model.features(obs))
    u = mean + log_std.exp() * torch.randn_like(mean)
    ref_action = model._center + model._half * torch.tanh(u)
    # the change of variables written out independently: log N(u) - log|d action / d u|
    ref_logp = (torch.distributions.Normal(mean, log_std.exp()).log_prob(u)
                - torch.log(model._half * (1 - torch.tanh(u) ** 2))).sum(-1)
    torch.testing.assert_close(action, ref_action)
    torch.testing.assert_close(logp, ref_logp, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(model.evaluate(obs, action.detach()).logprob, logp.detach(), rtol=1e-3, atol=1e-3)
    params = list(model.actor.parameters())
    for out, ref in ((logp, ref_logp), (action, ref_action)):
        grads = torch.autograd.grad(out.sum(), params, retain_graph=True)
        ref_grads = torch.autograd.grad(ref.sum(), params, retain_graph=True)
        for g, r in zip(grads, ref_grads):
            torch.testing.assert_close(g, r, rtol=1e-4, atol=1e-5)
    # Q heads read actions mapped into (-1, 1): the fused multiply-add equals (a - center) / half
    x = torch.cat([model.features(obs), (action.detach() - model._center) / model._half], dim=-1)
    ref_q = torch.stack([model._run(layers, x).squeeze(-1) for layers in model._q_layers])
    torch.testing.assert_close(model.q_values(obs, action.detach()), ref_q)


def test_sac_resumes_exactly_with_its_replay_buffer(workdir):
    args = [*PENDULUM, "num_envs=2", "algo.rollout_steps=4", "algo.warmup_steps=64", "algo.minibatch_size=32",
            "algo.buffer_size=1000", "model.hidden_sizes=[16,16]", "total_steps=400", "eval.episodes=1",
            "checkpoint.interval=10", "checkpoint.keep=100", "seed=5"]
    _run("rl", *args, "run_dir=a")
    full = _metrics(workdir / "a")
    assert len(full) == 1 + 50 + 1  # the start's validation (eval.best), the iterations, the final eval
    assert full[-2]["train/gradient_steps"] == 8.0 and full[1]["train/gradient_steps"] == 0.0  # warm-up, then utd=1
    ckpt = workdir / "a/checkpoints/iter_000020"
    _run("rl", f"resume={ckpt}", "run_dir=b")
    assert _metrics(workdir / "b") == full[21:]  # buffer, RNGs, targets and temperature all came back


def test_sac_killed_and_resumed_equals_the_uninterrupted_run(workdir):
    """SIGKILL mid-run, resume from the newest checkpoint: the metrics of the whole run, and the
    final weights, are those of a run never interrupted, and of one that never checkpointed (the
    buffer, its ring position, the warm-up's random actions, the running normalization statistics
    and the envs' running episodes all come back)."""
    from safetensors.torch import load_file

    from tests.cli.test_resume_exact import _kill_after, _latest_checkpoint

    args = [*PENDULUM, "num_envs=2", "algo.rollout_steps=4", "algo.warmup_steps=48", "algo.minibatch_size=32",
            "algo.buffer_size=600", "model.hidden_sizes=[16,16]", "total_steps=800", "eval.episodes=1", "seed=7",
            "env.normalize_obs=true", "env.normalize_reward=true"]
    _run("rl", *args, "checkpoint.interval=1000000", "run_dir=never")
    never = _metrics(workdir / "never")
    # the start's validation (eval.best), the iterations, the final eval; the ring wrapped around
    assert len(never) == 1 + 100 + 1 and never[-2]["rollout/replay_size"] == 600
    _kill_after([*args, "checkpoint.interval=5", "checkpoint.keep=3", "run_dir=killed"], dict(os.environ),
                workdir / "killed/checkpoints/iter_000020")
    last = _latest_checkpoint(workdir / "killed")
    assert 20 <= int(last.name.split("_")[1]) < 100
    res = _run("rl", f"resume={last}")
    assert "continuing the checkpoint's running statistics" in res.stderr
    assert _metrics(workdir / "killed") == never
    a = load_file(str(workdir / "never/checkpoints/final/model.safetensors"))
    b = load_file(str(workdir / "killed/checkpoints/final/model.safetensors"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_sac_leaves_auto_normalization_off(workdir):
    """Pendulum is state-based continuous control (auto turns normalization on for PPO), but SAC
    opts out of the default; it still normalizes when asked (the tests above)."""
    res = _run("rl", *PENDULUM, "num_envs=1", "algo.rollout_steps=8", "algo.warmup_steps=8", "algo.minibatch_size=8",
               "algo.buffer_size=100", "model.hidden_sizes=[8,8]", "total_steps=16", "eval.episodes=0", "run_dir=s")
    assert "=auto -> off: algorithm 'sac' does not take it by default" in res.stderr
    assert not (workdir / "s/checkpoints/final/normalizer.safetensors").exists()


def test_sac_refuses_bad_input_with_one_line(cli):
    res = cli("rl", "sim=gymnasium", "sim.env_id=CartPole-v1", "algo=sac", "tracking.enabled=false", "run_dir=x")
    assert res.code == 2 and "continuous actions" in res.err and "Traceback" not in res.err
    res = cli("rl", *PENDULUM, "algo.tau=2", "run_dir=y")
    assert res.code == 2 and "tau" in res.err and "Traceback" not in res.err
    res = cli("rl", *PENDULUM, "demos=does/not/exist", "run_dir=z")
    assert res.code == 2 and "does/not/exist" in res.err and "Traceback" not in res.err
    assert not Path("x").exists() and not Path("y").exists() and not Path("z").exists()


def test_sac_from_a_checkpoint_starts_at_the_runs_temperature(workdir, cli):
    """`rl algo=sac init=<ckpt>`: the entropy temperature the checkpoint stored (a clone's default
    1.0, an earlier run's learned one) gives way to this run's algo.init_temperature, with a note;
    a checkpoint without Q heads is refused in one line that says how to clone one for SAC."""
    from rlinf_cli.policy import load_policy

    tiny = ["num_envs=1", "algo.rollout_steps=8", "algo.minibatch_size=8", "algo.buffer_size=100",
            "model.hidden_sizes=[8,8]", "eval.episodes=0"]
    _run("rl", *PENDULUM, *tiny, "algo.warmup_steps=8", "total_steps=16", "run_dir=a")  # learns at 1.0
    start = float(load_policy(workdir / "a/checkpoints/final").log_alpha.detach().exp())
    assert start != pytest.approx(0.05)
    # no gradient step (all warm-up): the saved temperature is the one the run started at
    res = _run("rl", *PENDULUM, *tiny, "algo.warmup_steps=100", "total_steps=16", f"init={workdir / 'a/checkpoints/final'}",
               "algo.init_temperature=0.05", "run_dir=b")
    assert "the entropy temperature starts at algo.init_temperature=0.05" in res.stderr
    assert float(load_policy(workdir / "b/checkpoints/final").log_alpha.detach().exp()) == pytest.approx(0.05)
    _run("rl", *PENDULUM, "algo=ppo", "num_envs=1", "algo.rollout_steps=16", "model.hidden_sizes=[8,8]",
         "total_steps=16", "eval.episodes=0", "run_dir=p")
    res = cli("rl", *PENDULUM, f"init={workdir / 'p/checkpoints/final'}", "run_dir=c")
    assert res.code == 2 and "Traceback" not in res.err and not Path("c").exists()
    assert "has none (clone one for it with `rlinf sft ... model.squash=true model.q_heads=2" in " ".join(res.err.split())


def test_sac_from_demonstrations_samples_them(workdir):
    """`rl algo=sac demos=<dataset>`: half of every batch comes from the demonstrations, and the
    behaviour-cloning term on them is reported."""
    _run("rl", *PENDULUM, "num_envs=1", "algo.rollout_steps=8", "algo.warmup_steps=0", "algo.minibatch_size=32",
         "algo.buffer_size=1000", "model.hidden_sizes=[16,16]", "total_steps=64", "eval.episodes=0", "run_dir=expert")
    _run("collect", "sim=gymnasium", "sim.env_id=Pendulum-v1", f"policy={workdir / 'expert/checkpoints/final'}",
         "episodes=2", "output=demos", "tracking.enabled=false", "progress=false", "run_dir=c")
    res = _run("rl", *PENDULUM, "num_envs=1", "algo.rollout_steps=8", "algo.warmup_steps=16", "algo.minibatch_size=32",
               "algo.buffer_size=1000", "model.hidden_sizes=[16,16]", "total_steps=96", "eval.episodes=0",
               f"demos={workdir / 'demos'}", "algo.demo_fraction=0.25", "algo.bc_coef=0.1", "run_dir=d")
    assert "demonstrations: 398 transitions" in res.stderr  # 2 x 200 steps, each episode's time-limit step left out
    rows = [r for r in _metrics(workdir / "d") if r.get("train/gradient_steps", 0) > 0]
    assert rows and all(r["train/demo_fraction"] == 0.25 for r in rows)
    assert all(np.isfinite(r["train/bc_loss"]) for r in rows)


@pytest.mark.slow
@pytest.mark.learning
def test_sac_learns_pendulum(workdir, learning):
    """`rlinf rl --algo sac sim.env_id=Pendulum-v1` and nothing else: the gymnasium plugin's
    recommended settings (20k steps, 1k random, 64x64 ReLU, lr 1e-3). Random warm-up episodes
    return ~-1200; the deterministic policy must end near the documented return (~-150)."""
    _run("rl", *PENDULUM, "eval.episodes=10", "run_dir=p", f"seed={learning.seed}")
    rows = _metrics(workdir / "p")
    first = next(r["rollout/return_mean"] for r in rows if "rollout/return_mean" in r)
    final = json.loads((workdir / "p/result.json").read_text())["eval"]["return_mean"]
    assert first < -700, first  # where it starts: random actions
    learning.record(final, -400, first=first)
    assert final > -400 and final > first + 500, (first, final)


def test_sac_runs_the_same_with_envs_in_worker_processes_and_with_normalization(workdir):
    """The transitions path is the runtime's shared one: envs in worker processes give the numbers
    of envs in this process; the pipelined (hybrid) mode and running normalization work with it."""
    args = [*PENDULUM, "num_envs=2", "algo.rollout_steps=4", "algo.warmup_steps=16", "algo.minibatch_size=16",
            "algo.buffer_size=500", "model.hidden_sizes=[16,16]", "total_steps=64", "eval.episodes=1",
            "runtime.env_workers=2"]
    _run("rl", *args, "runtime.mode=collocated", "run_dir=c")
    _run("rl", *args, "runtime.mode=disaggregated", "run_dir=d")
    learning = lambda rows: [{k: v for k, v in r.items() if "transport/" not in k} for r in rows]  # noqa: E731
    assert learning(_metrics(workdir / "c")) == learning(_metrics(workdir / "d"))
    _run("rl", *args, "runtime.mode=hybrid", "env.normalize_obs=true", "env.normalize_reward=true", "run_dir=h")
    rows = _metrics(workdir / "h")
    assert rows[-2]["rollout/replay_size"] == 64 and np.isfinite(rows[-2]["train/critic_loss"])
    assert (workdir / "h/checkpoints/final/normalizer.safetensors").is_file()


def test_random_shift_moves_whole_images_and_keeps_uint8():
    from rlinf_algos.sac import random_shift

    torch.manual_seed(0)
    img = torch.randint(0, 256, (32, 12, 10, 3), dtype=torch.uint8)
    out = random_shift(img, 2)
    assert out.dtype == torch.uint8 and out.shape == img.shape
    assert torch.equal(random_shift(img, 0), img)
    rows, cols = torch.arange(12), torch.arange(10)
    for i in range(32):  # every sample is its own image under one shift in [-2, 2] x [-2, 2]
        fits = [(dy, dx) for dy in range(-2, 3) for dx in range(-2, 3)
                if torch.equal(out[i], img[i][(rows + dy).clamp(0, 11)][:, (cols + dx).clamp(0, 9)])]
        assert fits
    assert not all(torch.equal(out[i], img[i]) for i in range(32))  # and the shifts vary


def test_sac_on_pixels_with_random_shift(workdir):
    _run("rl", "sim=gymnasium", "sim.env_id=InvertedPendulum-v5", "sim.obs=rgb", "sim.image_size=32",
         "model.obs_keys=[rgb]", "algo=sac", "algo.image_shift=2", "num_envs=2", "algo.rollout_steps=8",
         "algo.warmup_steps=16", "algo.minibatch_size=16", "algo.buffer_size=200", "model.hidden_sizes=[16,16]",
         "total_steps=64", "eval.episodes=1", "tracking.enabled=false", "progress=false", "run_dir=px")
    rows = _metrics(workdir / "px")
    assert rows[-2]["train/gradient_steps"] == 16 and np.isfinite(rows[-2]["train/critic_loss"])
    from safetensors.torch import load_file

    saved = load_file(str(workdir / "px/checkpoints/final/env_state.safetensors"))
    assert saved["rank0.replay.obs.rgb"].dtype == torch.uint8  # pixels kept as uint8 in the checkpoint too
