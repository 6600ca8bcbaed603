"""The lean PPO update: LeanAdam is torch's (fused) Adam on flat buffers; a critic warm-up moves only the critic."""

from __future__ import annotations

import pytest
import torch

from rlinf_cli.runtime.optim import LeanAdam, LeanAdamW

pytestmark = pytest.mark.numerics  # results depend on CPU features: make test-portable runs them again


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


@pytest.mark.parametrize("decoupled,wd", [(False, 0.0), (False, 0.1), (True, 0.1)])
def test_lean_adam_is_torchs_fused_adam_on_flat_buffers(decoupled: bool, wd: float, monkeypatch) -> None:
    """From FUSED_MIN_PARAMS on, the flat path runs torch's fused Adam kernel once over all
    parameters: torch's fused Adam on the separate tensors agrees to float rounding (the kernel's
    vector tails fall elsewhere)."""
    import rlinf_cli.runtime.optim as optim

    monkeypatch.setattr(optim, "FUSED_MIN_PARAMS", 0)  # this toy model is below it
    calls: list[bool] = []
    kernel = optim._fused_kernel

    def counted(decoupled: bool, device: str):
        fn = kernel(decoupled, device)
        return lambda *args, **kwargs: (calls.append(decoupled), fn(*args, **kwargs))

    monkeypatch.setattr(optim, "_fused_kernel", counted)  # the seven ops agree to rounding too
    ref, lean_cls = (torch.optim.AdamW, LeanAdamW) if decoupled else (torch.optim.Adam, LeanAdam)
    a, b = _pair()
    _run(a, ref(a.parameters(), lr=1e-2, eps=1e-5, weight_decay=wd, fused=True), 12, 0)
    lean = lean_cls(b.parameters(), lr=1e-2, eps=1e-5, weight_decay=wd)
    _run(b, lean, 12, 0)
    assert lean._flat is not None  # the flat path really ran
    assert calls == [decoupled] * 12  # the kernel took every step
    for pa, pb in zip(a.parameters(), b.parameters()):
        assert torch.allclose(pa, pb, rtol=0, atol=1e-6), (pa - pb).abs().max()


@pytest.mark.parametrize("why", ["small model", "no fused kernel"])
def test_lean_adam_on_small_models_or_without_a_fused_kernel_is_bit_identical_to_torch_adam(why, monkeypatch) -> None:
    """Below FUSED_MIN_PARAMS (this toy model), or where torch has no fused kernel for the device,
    seven elementwise ops on the flat buffers give torch's per-tensor Adam bit for bit."""
    import rlinf_cli.runtime.optim as optim

    if why == "no fused kernel":
        monkeypatch.setattr(optim, "FUSED_MIN_PARAMS", 0)
        monkeypatch.setattr(optim, "_fused_kernel", lambda *args: None)
    a, b = _pair()
    _run(a, torch.optim.Adam(a.parameters(), lr=1e-2, eps=1e-5), 12, 0)
    lean = LeanAdam(b.parameters(), lr=1e-2, eps=1e-5)
    _run(b, lean, 12, 0)
    assert lean._flat is not None
    for pa, pb in zip(a.parameters(), b.parameters()):
        assert torch.equal(pa, pb)


def test_lean_adam_state_dict_is_torchs_and_loads_into_torch_adam() -> None:
    a, b = _pair()
    ref = torch.optim.Adam(a.parameters(), lr=1e-2, eps=1e-5)
    lean = LeanAdam(b.parameters(), lr=1e-2, eps=1e-5)
    _run(a, ref, 3, 0)
    _run(b, lean, 3, 0)
    sa, sb = ref.state_dict(), lean.state_dict()
    assert sa["param_groups"] == sb["param_groups"] and sa["state"].keys() == sb["state"].keys()
    for i in sa["state"]:
        for k in ("step", "exp_avg", "exp_avg_sq"):
            assert sa["state"][i][k].dtype == sb["state"][i][k].dtype and torch.equal(sa["state"][i][k], sb["state"][i][k])
    back = torch.optim.Adam(a.parameters(), lr=1e-2, eps=1e-5)
    back.load_state_dict(sb)  # a LeanAdam checkpoint resumes in torch's Adam and the other way round
    lean.load_state_dict(sa)


def test_lean_adam_does_not_import_torch_dynamo() -> None:
    """torch's own Adam imports torch._dynamo on first use (~1.3 s of every run's start)."""
    import subprocess
    import sys

    code = ("import sys, torch\nfrom rlinf_cli.runtime.optim import LeanAdam\n"
            "m = torch.nn.Linear(3, 2)\nopt = LeanAdam(m.parameters(), lr=1e-2)\n"
            "for _ in range(3):\n    opt.zero_grad()\n    m(torch.ones(4, 3)).sum().backward()\n    opt.step()\n"
            "opt.load_state_dict(opt.state_dict())\nopt.step()\n"
            "print('torch._dynamo' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split()[0] == "False", out.stdout


def test_parameters_that_sat_out_steps_keep_their_own_adam_step() -> None:
    a, b = _pair()
    _run(a, torch.optim.Adam(a.parameters(), lr=1e-2), 8, 3)
    _run(b, LeanAdam(b.parameters(), lr=1e-2), 8, 3)
    for pa, pb in zip(a.parameters(), b.parameters()):
        assert torch.equal(pa, pb)


def test_critic_warm_up_leaves_everything_the_actor_reads_untouched() -> None:
    # A pixel policy's CNN encoder is shared by actor and critic: a warm-up on the value loss
    # alone must not move it (it once turned a 100% cloned pixel policy into 0%).
    from rlinf_algos.ppo import PPO
    from rlinf_cli.api import ArraySpec, EnvSpec
    from rlinf_cli.runtime.batches import SampleBatches
    from rlinf_cli.experience import Experience
    from rlinf_cli.runtime.engine import make_engine
    from rlinf_cli.runtime.update import update
    from rlinf_model_mlp.model import MLPPolicy

    spec = EnvSpec({"rgb": ArraySpec((16, 16, 3), "uint8", 0, 255), "state": ArraySpec((3,), "float32")},
                   ArraySpec((2,), "float32", -1.0, 1.0))
    torch.manual_seed(0)
    policy = MLPPolicy({"name": "mlp", "obs_keys": ["rgb", "state"], "hidden_sizes": [16],
                        "cnn_channels": [4], "cnn_kernels": [4], "cnn_strides": [2], "cnn_features": 8}, spec)
    T, N = 8, 4
    g = torch.Generator().manual_seed(0)
    obs = {"rgb": torch.randint(0, 255, (T, N, 16, 16, 3), generator=g, dtype=torch.uint8),
           "state": torch.randn(T, N, 3, generator=g)}
    with torch.no_grad():
        out = policy.act({k: v.reshape(T * N, *v.shape[2:]) for k, v in obs.items()})
    exp = Experience(obs, out.action.reshape(T, N, 2), out.logprob.reshape(T, N), out.value.reshape(T, N),
                     torch.randn(T, N, generator=g), torch.zeros(T, N), torch.zeros(T, N), torch.ones(T, N), torch.zeros(N))
    before = {k: v.clone() for k, v in policy.state_dict().items()}
    algo = PPO.from_config({"name": "ppo", "epochs": 2, "minibatch_size": 16})
    batches = SampleBatches()
    engine = make_engine(policy, algo.optim, {"backend": "torch"})
    update(engine, algo, exp, batches, torch.Generator().manual_seed(1), critic_only=True)
    after = policy.state_dict()
    moved = {k for k in before if not torch.equal(before[k], after[k])}
    assert moved and all(k.startswith("critic.") for k in moved), moved


def _critic_warm_up(algo_config: dict) -> tuple[float, float, float]:
    """One critic-only update of a tiny MLP policy: (critic weight displacement, engine lr before,
    engine lr after)."""
    from rlinf_algos.ppo import PPO
    from rlinf_cli.api import ArraySpec, EnvSpec
    from rlinf_cli.runtime.batches import SampleBatches
    from rlinf_cli.experience import Experience
    from rlinf_cli.runtime.engine import make_engine
    from rlinf_cli.runtime.update import update
    from rlinf_model_mlp.model import MLPPolicy

    spec = EnvSpec({"state": ArraySpec((3,), "float32")}, ArraySpec((2,), "float32", -1.0, 1.0))
    torch.manual_seed(0)
    policy = MLPPolicy({"name": "mlp", "hidden_sizes": [16]}, spec)
    T, N = 8, 4
    g = torch.Generator().manual_seed(0)
    obs = {"state": torch.randn(T, N, 3, generator=g)}
    with torch.no_grad():
        out = policy.act({"state": obs["state"].reshape(T * N, 3)})
    exp = Experience(obs, out.action.reshape(T, N, 2), out.logprob.reshape(T, N), out.value.reshape(T, N),
                     torch.randn(T, N, generator=g), torch.zeros(T, N), torch.zeros(T, N), torch.ones(T, N), torch.zeros(N))
    before = [p.detach().clone() for p in policy.critic_parameters()]
    algo = PPO.from_config({"name": "ppo", "epochs": 1, "minibatch_size": 32, "lr": 1e-4, **algo_config})
    engine = make_engine(policy, algo.optim, {"backend": "torch"})
    lr0 = engine.lr
    update(engine, algo, exp, SampleBatches(),
           torch.Generator().manual_seed(1), critic_only=True)
    moved = sum(float((p.detach() - b).abs().max()) for p, b in zip(policy.critic_parameters(), before))
    return moved, lr0, engine.lr


def test_critic_warm_up_runs_at_its_own_learning_rate_and_restores_the_actors() -> None:
    # A fresh critic warmed up at an actor's fine-tuning lr barely moves (model=vla: explained
    # variance ~0 after 7 iterations at 3e-5); critic_warmup_lr gives the warm-up its own rate.
    plain, lr0, lr1 = _critic_warm_up({})
    fast, lr0_fast, lr1_fast = _critic_warm_up({"critic_warmup_lr": 1e-2})
    assert lr0 == lr1 == lr0_fast == lr1_fast == 1e-4  # the actor's lr is back after the warm-up
    # one Adam step moves each weight by ~lr: 100x the rate, ~100x the displacement
    assert fast > 30 * plain > 0, (plain, fast)


@pytest.mark.parametrize("use_flat", [False, True])
def test_clip_grad_norm_is_torchs_with_or_without_the_flat_gradient(use_flat: bool) -> None:
    """The multi-tensor clip and the flat one (one norm, one scale over LeanAdam's gradient
    buffer) both match torch.nn.utils.clip_grad_norm_ to rounding, norm and clipped gradients."""
    from rlinf_cli.runtime.optim import clip_grad_norm

    a, b = _pair()
    lean = LeanAdam(b.parameters(), lr=1e-2, eps=1e-5)
    _run(b, lean, 2, 0)  # flat buffers exist after the first step
    x = torch.randn(8, 5, generator=torch.Generator().manual_seed(4))
    for m in (a, b):
        m.zero_grad(set_to_none=False)
        (100 * m(x)).pow(2).mean().backward()  # large: the clip binds
    a.load_state_dict(b.state_dict())
    for pa, pb in zip(a.parameters(), b.parameters()):
        pa.grad = pb.grad.clone()
    ref = torch.nn.utils.clip_grad_norm_(list(a.parameters()), 0.5)
    flat = lean.flat_grad() if use_flat else None
    assert (flat is not None) == use_flat
    norm = clip_grad_norm(list(b.parameters()), 0.5, flat)
    assert ref > 0.5
    torch.testing.assert_close(norm, ref, rtol=1e-6, atol=0)
    for pa, pb in zip(a.parameters(), b.parameters()):
        torch.testing.assert_close(pb.grad, pa.grad, rtol=1e-5, atol=1e-7)
    if use_flat:  # the parameters' gradients are still views of the buffer the optimizer steps
        assert all(p.grad.data_ptr() == v.data_ptr() for p, v in zip(b.parameters(), lean._flat["grad_views"]))


def test_lean_adam_step_counts_are_views_of_one_buffer_and_round_trip() -> None:
    a, b = _pair()
    lean = LeanAdam(b.parameters(), lr=1e-2, eps=1e-5)
    _run(b, lean, 3, 0)
    steps = [lean.state[p]["step"] for p in b.parameters()]
    assert all(float(s) == 3.0 for s in steps) and len({s.data_ptr() for s in steps}) == len(steps)
    ref = torch.optim.Adam(a.parameters(), lr=1e-2, eps=1e-5)
    ref.load_state_dict(lean.state_dict())
    assert all(float(ref.state[p]["step"]) == 3.0 for p in a.parameters())
