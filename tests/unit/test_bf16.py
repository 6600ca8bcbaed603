"""Mixed precision (`train.bf16=true` on the torch backend): matrix products of the training
forward and backward passes run in bf16, while weights, gradients, optimizer state, losses,
log-probs and Q targets stay fp32; `auto` stays fp32; bad values are refused up front."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from rlinf_cli.api import ArraySpec, EnvSpec
from tests.conftest import RLINF

pytestmark = pytest.mark.numerics  # results depend on CPU features: make test-portable runs them again

PENDULUM = ["sim=gymnasium", "sim.env_id=Pendulum-v1", "algo=sac", "tracking.enabled=false", "progress=false"]
MATMULS = {"addmm", "mm", "bmm", "linear", "matmul"}


class MatmulDtypes(TorchDispatchMode):
    """Records the dtype of every matrix product that reaches the kernels (after autocast), and
    the fp32 math mode oneDNN was in for it."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[torch.dtype] = []
        self.modes: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
        if func.overloadpacket.__name__ in MATMULS:
            self.seen.append(args[0].dtype)
            self.modes.append(torch.backends.mkldnn.matmul.fp32_precision)
        return func(*args, **(kwargs or {}))


def _onednn_rounds_the_hidden_layers() -> bool:
    """Whether oneDNN's bf16 math mode really rounds the toy SAC network's hidden products (32x32
    at batch 64) on this CPU: measured, as the engine measures it, never assumed from the CPU flags."""
    from rlinf_cli.runtime.precision import onednn_bf16_available, onednn_bf16_rounds

    return onednn_bf16_available() and not onednn_bf16_rounds([(32, 32)], batch=64)


def _sac(bf16: object, seed: int = 0):
    """A SAC policy, algorithm and engine on a 3-d / 2-d toy spec, and one fixed batch."""
    from rlinf_algos.sac import SAC, SACConfig

    from rlinf_cli.algorithm import TransitionBatch
    from rlinf_cli.registry import get_registry
    from rlinf_cli.runtime.engine import make_engine

    spec = EnvSpec(observation={"state": ArraySpec((3,), "float32")},
                   action=ArraySpec((2,), "float32", low=-2.0, high=2.0), max_episode_steps=5)
    algo = SAC(SACConfig(minibatch_size=64, warmup_steps=0))
    algo.check(spec)
    torch.manual_seed(seed)
    policy = get_registry().load("model", "mlp")(
        {"name": "mlp", "hidden_sizes": [32, 32], "activation": "relu", **algo.model_options()}, spec)
    engine = make_engine(policy, algo.optim, {"backend": "torch", "bf16": bf16})
    g = torch.Generator().manual_seed(1)
    n = 64
    batch = TransitionBatch({"state": torch.randn(n, 3, generator=g) * 3}, torch.rand(n, 2, generator=g) * 4 - 2,
                            torch.randn(n, generator=g) * 50, {"state": torch.randn(n, 3, generator=g) * 3},
                            (torch.rand(n, generator=g) < 0.1).float(), torch.zeros(n))
    return policy, algo, engine, batch


def _gradient_step(policy, algo, engine, batch, modes: list | None = None
                   ) -> tuple[torch.Tensor, dict, list[torch.dtype], dict]:
    """One step as rlinf_cli/runtime/update.py takes it; also the dtypes the policy's outputs had
    (and, into ``modes``, oneDNN's fp32 math mode at each matrix product)."""
    from rlinf_cli.runtime.precision import mixed_precision_active

    seen: dict[str, list[torch.dtype]] = {"logp": [], "q": [], "autocast": []}
    sample, q_values = policy.sample, policy.q_values

    def spy_sample(obs):
        a, logp = sample(obs)
        seen["logp"].append(logp.dtype)
        seen["autocast"].append(mixed_precision_active("cpu"))
        return a, logp

    def spy_q(*args, **kwargs):
        q = q_values(*args, **kwargs)
        seen["q"].append(q.dtype)
        return q

    policy.sample, policy.q_values = spy_sample, spy_q
    try:
        with MatmulDtypes() as mode:
            with engine.autocast():
                loss, stats = algo.transition_loss(policy, batch)
            engine.backward(loss)
        engine.step()
        algo.after_step(policy)
    finally:
        del policy.sample, policy.q_values
    if modes is not None:
        modes.extend(mode.modes)
    return loss, stats, mode.seen, seen


@pytest.mark.parametrize("onednn", [True, False], ids=["onednn-math", "autocast"])
def test_bf16_runs_the_matmuls_in_bf16_and_keeps_losses_log_probs_and_weights_fp32(onednn):
    policy, algo, engine, batch = _sac(True)
    if onednn and not _onednn_rounds_the_hidden_layers():
        pytest.skip("this CPU's oneDNN does not round the test network's hidden products under its bf16 math "
                    "mode (measured): the engine uses autocast (the other case)")
    assert engine.onednn_bf16 == _onednn_rounds_the_hidden_layers()  # an MLP takes oneDNN's bf16 math where it works
    engine.onednn_bf16 = onednn
    before = {k: v.detach().clone() for k, v in policy.state_dict().items()}
    modes: list[str] = []
    loss, stats, matmuls, seen = _gradient_step(policy, algo, engine, batch, modes)
    assert engine.bf16
    if onednn:  # every product on fp32 tensors; the hidden layers' (and the backward pass's) in
        # oneDNN's bf16 mode, the first and output layers' forward products in full fp32
        assert set(matmuls) == {torch.float32} and modes.count("bf16") > len(modes) // 2, (matmuls, modes)
        assert "none" in modes
    else:
        # hidden layers in bf16 (forward and backward); the output layers (fp32 by design) are the rest
        assert matmuls.count(torch.bfloat16) > len(matmuls) // 2, matmuls
        assert torch.float32 in matmuls  # output layers: Q values, means and log stds stay fp32
        assert "bf16" not in modes
    assert all(seen["autocast"])  # the loss was computed inside the engine's mixed precision
    assert set(seen["logp"]) == {torch.float32} and set(seen["q"]) == {torch.float32}
    assert loss.dtype == torch.float32 and all(v.dtype == torch.float32 for v in stats.values())
    after = policy.state_dict()
    assert all(v.dtype == torch.float32 for v in after.values())  # master weights, targets, temperature
    moved = [k for k in before if not torch.equal(before[k], after[k])]
    assert any(k.startswith("actor.") for k in moved) and any(k.startswith("q.") for k in moved)
    assert any(k.startswith("q_target.") for k in moved) and "log_alpha" in moved  # every part still learns
    assert not torch.is_autocast_enabled("cpu")  # nothing leaks out of the update
    assert torch.backends.mkldnn.matmul.fp32_precision == "none"


def test_onednn_bf16_keeps_first_and_output_layers_in_full_fp32():
    """Under the engine's oneDNN bf16 math the MLP rounds only its hidden layers' products:
    observations going in and Q values coming out keep their digits."""
    from rlinf_cli.runtime.precision import onednn_bf16_matmuls

    if not _onednn_rounds_the_hidden_layers():
        pytest.skip("this CPU's oneDNN does not round 32x32 products at batch 64 under its bf16 math mode (measured)")
    policy, _, _, batch = _sac(True)
    with MatmulDtypes() as mode, torch.no_grad(), onednn_bf16_matmuls():
        q = policy.q_values(batch.obs, batch.actions)
        mean = policy.mean_action(batch.obs)
    # two Q heads, then the actor: input, hidden, output layer each
    assert mode.modes == ["none", "bf16", "none"] * 3, mode.modes
    with torch.no_grad():
        q32, mean32 = policy.q_values(batch.obs, batch.actions), policy.mean_action(batch.obs)
    assert not torch.equal(q, q32)  # the hidden products really were rounded
    assert torch.allclose(q, q32, rtol=0.02, atol=0.02) and torch.allclose(mean, mean32, rtol=0.02, atol=0.02)
    assert torch.backends.mkldnn.matmul.fp32_precision == "none"


def test_onednn_math_that_does_not_round_falls_back_to_autocast_and_says_so(monkeypatch):
    """A CPU whose oneDNN says it has bf16 kernels but computes these shapes in full fp32 anyway
    (a Zen 4 at small sizes; ONEDNN_MAX_CPU_ISA=AVX512_CORE_BF16 on a Sapphire Rapids): the engine
    measures it, trains under autocast (whose bf16 tensors round by construction), says so in one
    line and records the precision that ran."""
    from rlinf_cli.runtime import engine as eng, precision

    # patched where the engine looks them up
    monkeypatch.setattr(eng, "onednn_bf16_available", lambda: True)
    probed: list = []

    def nothing_rounds(shapes, batch=precision.PROBE_BATCH):
        probed.extend(shapes)
        return list(shapes)

    monkeypatch.setattr(eng, "onednn_bf16_rounds", nothing_rounds)
    policy, algo, engine, batch = _sac(True)
    assert set(probed) == {(32, 32)}  # the hidden layers only: input and output layers stay fp32 by design
    assert engine.bf16 and not engine.onednn_bf16 and engine.precision == "bf16-autocast"
    note = precision.precision_note(engine)
    assert "keeps these layers' products in full fp32" in note and "32x32" in note and "autocast instead" in note
    _, _, matmuls, _ = _gradient_step(policy, algo, engine, batch)
    assert torch.bfloat16 in matmuls  # and bf16 really ran


def test_the_probe_measures_rounding():
    """``onednn_bf16_rounds`` reports a shape as unrounded exactly when the flag leaves its
    product bit-equal to fp32; with the flag ignored (no bf16 kernels), every shape."""
    from rlinf_cli.runtime import precision as eng

    shapes = [(32, 32), (256, 256), (32, 32)]
    out = eng.onednn_bf16_rounds(shapes)
    assert len(out) == len(set(out)) and set(out) <= {(32, 32), (256, 256)}
    if not eng.onednn_bf16_available():
        assert out == [(32, 32), (256, 256)]  # nothing can round without bf16 kernels


def test_precision_that_ran_is_recorded():
    _, _, engine, _ = _sac(False)
    assert engine.precision == "fp32"
    _, _, engine, _ = _sac(True)
    assert engine.precision == ("bf16-onednn" if engine.onednn_bf16 else "bf16-autocast")


def test_policies_with_convolutions_keep_autocast():
    """oneDNN's fp32 mode is slower than autocast's bf16 kernels for convolutions (measured): a
    pixel policy stays with autocast."""
    from rlinf_cli.algorithm import OptimSpec
    from rlinf_cli.runtime.engine import make_engine
    from rlinf_model_mlp.model import MLPPolicy

    spec = EnvSpec({"rgb": ArraySpec((16, 16, 3), "uint8", 0, 255)}, ArraySpec((2,), "float32", -1.0, 1.0))
    policy = MLPPolicy({"name": "mlp", "obs_keys": ["rgb"], "hidden_sizes": [16], "cnn_channels": [4],
                        "cnn_kernels": [4], "cnn_strides": [2], "cnn_features": 8}, spec)
    engine = make_engine(policy, OptimSpec(1e-3), {"backend": "torch", "bf16": True})
    assert engine.bf16 and not engine.onednn_bf16
    with engine.autocast():
        assert torch.is_autocast_enabled("cpu")


@pytest.mark.parametrize("setting", [False, "auto", None])
def test_fp32_unless_asked(setting):
    """`auto` (the default) and false keep every matrix product in fp32 on CPU."""
    policy, algo, engine, batch = _sac(setting)
    _, _, matmuls, seen = _gradient_step(policy, algo, engine, batch)
    assert not engine.bf16 and matmuls and set(matmuls) == {torch.float32}
    assert not any(seen["autocast"])


def test_bf16_loss_is_close_to_fp32_but_not_equal():
    """Same weights, same batch: the bf16 loss differs from fp32 (the products really ran in
    bf16) by about bf16's rounding, not more (the casts are in the right places)."""
    torch.manual_seed(3)  # the actor's reparameterisation noise: the same draws for both
    loss32 = _gradient_step(*_sac(False))[0].item()
    torch.manual_seed(3)
    loss16 = _gradient_step(*_sac(True))[0].item()
    assert loss16 != loss32
    assert abs(loss16 - loss32) < 0.02 * abs(loss32), (loss16, loss32)


def test_ppo_trains_under_the_same_autocast(cli, monkeypatch):
    """The on-policy loop takes the engine's autocast too (one option for every algorithm): a
    PPO run through the CLI evaluates its minibatches under bf16 autocast, with fp32 log-probs."""
    from rlinf_model_mlp.model import MLPPolicy

    calls: list[tuple[bool, torch.dtype]] = []
    evaluate = MLPPolicy.evaluate

    def spy(self, obs, action):
        from rlinf_cli.runtime.precision import mixed_precision_active

        out = evaluate(self, obs, action)
        calls.append((mixed_precision_active("cpu"), out.logprob.dtype))
        return out

    monkeypatch.setattr(MLPPolicy, "evaluate", spy)
    args = ["rl", "sim=gymnasium", "sim.env_id=Pendulum-v1", "algo=ppo", "tracking.enabled=false", "progress=false",
            "num_envs=2", "algo.rollout_steps=16", "algo.minibatch_size=16", "algo.epochs=1", "total_steps=64",
            "eval.episodes=0", "model.hidden_sizes=[16,16]"]
    res = cli(*args, "train.bf16=true", "run_dir=b")
    assert res.code == 0, res.err[-2000:]
    assert calls and all(on and dtype == torch.float32 for on, dtype in calls), calls
    calls.clear()
    res = cli(*args, "run_dir=f")  # the default: no autocast
    assert res.code == 0, res.err[-2000:]
    assert calls and not any(on for on, _ in calls)


def _run(*args: str, timeout: int = 600) -> subprocess.CompletedProcess:
    return subprocess.run([RLINF, *args], capture_output=True, text=True, timeout=timeout)


def test_sac_with_bf16_runs_through_the_cli(workdir):
    """... and MLflow records the precision that really ran (`train.precision_used`)."""
    from mlflow.tracking import MlflowClient

    res = _run("rl", *[a for a in PENDULUM if a != "tracking.enabled=false"], "num_envs=1", "algo.rollout_steps=8", "algo.warmup_steps=64", "algo.minibatch_size=32",
               "algo.buffer_size=1000", "model.hidden_sizes=[32,32]", "total_steps=400", "eval.episodes=1",
               "train.bf16=true", "run_dir=b")
    assert res.returncode == 0, res.stderr[-3000:]
    assert "train.bf16=true" in res.stderr  # the run says what it does
    rows = [json.loads(x) for x in (workdir / "b/metrics.jsonl").read_text().splitlines()]
    trained = [r for r in rows if r.get("train/gradient_steps", 0) > 0]
    assert trained and all(np.isfinite(r["train/critic_loss"]) and np.isfinite(r["train/actor_loss"]) for r in trained)
    result = json.loads((workdir / "b/result.json").read_text())
    assert np.isfinite(result["eval"]["return_mean"])
    client = MlflowClient(tracking_uri=f"sqlite:///{workdir / 'rlinf_runs' / 'mlflow.db'}")
    params = client.get_run(result["mlflow_run_id"]).data.params
    assert params["train.bf16"] == "True" and params["train.precision_used"] in ("bf16-onednn", "bf16-autocast")


@pytest.mark.parametrize("value", ["yes", "2", "bf16"])
def test_bad_bf16_value_is_one_line_and_exit_2(cli, value):
    res = cli("rl", *PENDULUM, f"train.bf16={value}", "run_dir=x")
    assert res.code == 2, res.err
    lines = [x for x in res.err.strip().splitlines() if x.strip()]
    assert len(lines) == 1 and "train.bf16" in lines[0] and "auto, true or false" in lines[0], res.err
    assert "Traceback" not in res.err and not Path("x").exists()


@pytest.mark.slow
@pytest.mark.learning
def test_sac_learns_pendulum_in_bf16(workdir, learning):
    """test_sac.py::test_sac_learns_pendulum (the recommended Pendulum settings) with
    train.bf16=true: the same bar. Where oneDNN has no bf16 kernels (make test-portable's
    avx2-1thread) autocast emulates bf16 on one thread: 20k steps took over 600 s there beside
    another test, hence the long timeout."""
    res = _run("rl", *PENDULUM, "eval.episodes=10", "train.bf16=true", "run_dir=p", f"seed={learning.seed}",
               timeout=1800)
    assert res.returncode == 0, res.stderr[-3000:]
    rows = [json.loads(x) for x in (workdir / "p/metrics.jsonl").read_text().splitlines()]
    first = next(r["rollout/return_mean"] for r in rows if "rollout/return_mean" in r)
    final = json.loads((workdir / "p/result.json").read_text())["eval"]["return_mean"]
    assert first < -700, first
    learning.record(final, -400, first=first)
    assert final > -400 and final > first + 500, (first, final)


def test_bf16_null_means_auto():
    """`train.bf16=null` passes validation and the engine reads it as auto (fp32 on the torch backend)."""
    from rlinf_cli.runtime.precision import bf16_setting
    from rlinf_cli.validate import COMMON

    rule = next(r for r in COMMON if r[0] == "train.bf16")
    assert rule[1](None) and rule[1]("auto") and rule[1](True) and not rule[1]("yes")
    assert bf16_setting(None) == "auto"
    _, _, engine, _ = _sac(None)
    assert engine.bf16 is False
