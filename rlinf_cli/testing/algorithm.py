"""The algorithm contract.

RL algorithms: ``advantages`` and ``loss`` on a fixed batch (finite, the right shapes, a loss
that gradient steps lower), then tiny `rlinf rl` runs: finite metrics, two seeded runs that
agree, and a run resumed from its first checkpoint that ends with the same weights.
Supervised algorithms: a short `rlinf sft` on expert demonstrations whose loss falls, and two
seeded runs that agree.
"""

from __future__ import annotations

import math
import tempfile
from pathlib import Path
from typing import Any

from rlinf_cli.errors import UserError
from rlinf_cli.registry import make_simulator
from rlinf_cli.testing.plugins import option, spec_of
from rlinf_cli.testing.report import Check, Checks, finite, shape_of
from rlinf_cli.testing.runs import metrics, rlinf, untimed

COMMON = ["tracking.enabled=false", "progress=false"]
SFT_EPOCHS = 5


def algorithm_checks(name: str, workdir: Path | None = None) -> list[Check]:
    """Run the contract of the installed algorithm ``name``; tiny runs go to ``workdir`` (a temporary
    directory by default)."""
    checks = Checks()
    spec = spec_of("algorithm", name)
    built: list[Any] = []

    def construct() -> str:
        from rlinf_cli.algorithm import ROLLOUT_KINDS

        algo = spec.load().from_config(option(spec, "algo"))
        assert algo.rollout in ROLLOUT_KINDS, f"rollout is {algo.rollout!r}; expected one of {ROLLOUT_KINDS}"
        built.append(algo)
        return f"rollout={algo.rollout}"

    if not checks.run(f"from_config(conf/algo/{name}.yaml)", construct):
        return checks.rows
    algo = built[0]
    with tempfile.TemporaryDirectory(prefix="rlinf-contract-") as tmp:
        where = Path(workdir or tmp)
        if algo.rollout == "supervised":
            _supervised(checks, spec, where)
        else:
            _fixed_batch(checks, algo)
            _tiny_runs(checks, spec, algo, where)
    return checks.rows


# -- a fixed batch -----------------------------------------------------------------------------
def _experience(algo: Any, T: int = 8) -> Any:
    import torch

    from rlinf_cli.api import Experience

    # group rollouts: two groups of the configured size, side by side
    group = int(getattr(algo.config, "group_size", 2) or 2) if algo.rollout == "episodes" else 1
    N = max(4, 2 * group)
    g = torch.Generator().manual_seed(0)
    dones = torch.zeros(T, N)
    dones[3, 0] = dones[5, 2] = 1.0
    trunc = torch.zeros(T, N)
    trunc[5, 2] = 0.5  # env 2 was cut by a time limit at step 5: bootstrap from its last value
    return Experience({"state": torch.zeros(T, N, 4)}, torch.zeros(T, N, 2), torch.zeros(T, N),
                      torch.randn(T, N, generator=g), torch.randn(T, N, generator=g), dones, trunc,
                      torch.ones(T, N), torch.randn(N, generator=g),
                      episode_returns=torch.randn(N, generator=g), group_size=group)


def _fixed_batch(checks: Checks, algo: Any) -> None:
    if algo.rollout == "transitions":
        why = "off-policy losses read Q heads of a model; the tiny runs below check them"
        checks.skip("advantages() on a fixed experience", why)
        checks.skip("loss() on a fixed minibatch falls under gradient steps", why)
        return

    def advantages() -> str:
        import torch

        exp = _experience(algo)
        adv, ret = algo.advantages(exp)
        want = tuple(exp.rewards.shape)
        assert shape_of(adv) == want, f"advantages() returned advantages of shape {shape_of(adv)}; expected {want}"
        assert shape_of(ret) == want, f"advantages() returned returns of shape {shape_of(ret)}; expected {want}"
        assert torch.isfinite(adv).all() and torch.isfinite(ret).all(), "advantages() returned non-finite values"
        return f"[T, N] = {list(want)}"

    checks.run("advantages() on a fixed experience: finite, [T, N]", advantages)
    checks.run("loss() on a fixed minibatch: finite, and gradient steps lower it", lambda: _loss_falls(algo))


def _loss_falls(algo: Any, steps: int = 25, batch: int = 64) -> str:
    """A linear Gaussian policy stands in for a model: the loss of a fixed minibatch must be a
    finite scalar with a gradient, and Adam steps on it must lower it (a loss that cannot fall
    cannot train anything)."""
    import torch

    from rlinf_cli.api import EvalOutput, MiniBatch

    g = torch.Generator().manual_seed(0)
    obs = torch.randn(batch, 4, generator=g)
    w = (0.1 * torch.randn(4, 2, generator=g)).requires_grad_()
    log_std = torch.zeros(2, requires_grad=True)
    wv = (0.1 * torch.randn(4, generator=g)).requires_grad_()

    def evaluate(actions: torch.Tensor) -> EvalOutput:
        dist = torch.distributions.Independent(torch.distributions.Normal(obs @ w, log_std.exp()), 1)
        return EvalOutput(dist.log_prob(actions), dist.entropy(), obs @ wv)

    with torch.no_grad():
        actions = obs @ w + torch.randn(batch, 2, generator=g)
        old = evaluate(actions)
    ref = old.logprob.clone() if algo.needs_reference() else None
    mb = MiniBatch(old_logprob=old.logprob.clone(), advantages=torch.randn(batch, generator=g),
                   returns=torch.randn(batch, generator=g), old_values=old.value.clone(), mask=None,
                   ref_logprob=ref, obs={"state": obs}, actions=actions)

    def loss_now() -> torch.Tensor:
        loss = algo.loss(evaluate(actions), mb)[0]
        assert shape_of(loss) == (), f"loss() returned a loss of shape {shape_of(loss)}; expected a scalar"
        assert math.isfinite(float(loss.detach())), f"loss() returned {float(loss.detach())} on a fixed minibatch"
        assert loss.requires_grad, "loss() returned a loss with no gradient to the policy (is it detached?)"
        return loss

    opt = torch.optim.Adam([w, log_std, wv], lr=1e-2)
    first = float(loss_now().detach())
    for _ in range(steps):
        opt.zero_grad()
        loss_now().backward()
        opt.step()
    last = float(loss_now().detach())
    assert last < first - 1e-4 * abs(first), \
        f"the loss did not fall: {first:.4g} before {steps} Adam steps on one minibatch, {last:.4g} after"
    return f"{first:.4g} -> {last:.4g} in {steps} Adam steps"


# -- tiny runs ---------------------------------------------------------------------------------
def _accepts_cartpole(algo: Any) -> bool:
    try:
        algo.check(make_simulator({"name": "gymnasium", "env_id": "CartPole-v1"}).spec)
    except UserError:
        return False
    return True


def _rl_args(spec: Any, algo: Any) -> list[str]:
    node = option(spec, "algo")
    args = [f"algo={spec.name}", "num_envs=2", "eval.episodes=1", "checkpoint.interval=1", "checkpoint.keep=5",
            "seed=3", "total_steps=60", *COMMON]
    if "rollout_steps" in node:
        args.append("algo.rollout_steps=16")
    if "group_size" in node:
        args += ["algo.group_size=2", "algo.groups=1"]
    if node.get("minibatch_size"):
        args.append("algo.minibatch_size=16")
    if "warmup_steps" in node:  # off-policy: learn within the tiny budget, from a small buffer
        args += ["algo.warmup_steps=8", "algo.buffer_size=1000"]
    if not _accepts_cartpole(algo):
        args.append("sim.env_id=Pendulum-v1")  # continuous actions (the default CartPole's are discrete)
    if not algo.uses_critic:
        args.append("model.critic=false")
    return args


def _finite_rows(rows: list[dict[str, Any]]) -> str:
    for i, row in enumerate(rows):
        bad = sorted(k for k, v in row.items() if k.startswith("train/") and not finite(v))
        assert not bad, f"{', '.join(f'{k}={row[k]}' for k in bad)} at metrics row {i + 1}"
    return f"{len(rows)} metrics rows"


def _tiny_runs(checks: Checks, spec: Any, algo: Any, where: Path) -> None:
    args = _rl_args(spec, algo)

    def run_a() -> str:
        rlinf(where, "rl", *args, f"run_dir={where / 'a'}")
        return _finite_rows(metrics(where / "a"))

    if not checks.run("a tiny `rlinf rl` run: finite train/ metrics", run_a):
        return

    def same_seed() -> str:
        import json

        rlinf(where, "rl", *args, f"run_dir={where / 'b'}")
        # the rows that trained (not the starting policy's validation, eval.best)
        a, b = ([r for r in untimed(metrics(where / d)) if any(k.startswith("train/") for k in r)] for d in "ab")
        assert a[0] == b[0], f"two runs with seed=3 differ: {json.dumps(a[0])[:200]} vs {json.dumps(b[0])[:200]}"
        return "first iterations' metrics are identical"

    def resume() -> str:
        import json

        import torch
        from safetensors.torch import load_file

        state = json.loads((where / "a/checkpoints/final/trainer_state.json").read_text())
        assert state["iteration"] >= 2, "the tiny run took fewer than two iterations"
        rlinf(where, "rl", f"resume={where / 'a/checkpoints/iter_000001'}", f"run_dir={where / 'c'}")
        full = load_file(str(where / "a/checkpoints/final/model.safetensors"))
        resumed = load_file(str(where / "c/checkpoints/final/model.safetensors"))
        assert set(full) == set(resumed), "the resumed run saved other tensors"
        moved = [k for k in full if not torch.equal(full[k], resumed[k])]
        assert not moved, f"resumed from iteration 1, the run ends with other weights ({moved[0]}, ...)"
        return f"{len(full)} tensors bit-identical"

    checks.run("two runs with one seed log the same metrics", same_seed)
    checks.run("a run resumed from its first checkpoint ends with the same weights", resume)


def _supervised(checks: Checks, spec: Any, where: Path) -> None:
    sft = ["sft", f"algo={spec.name}", f"dataset={where / 'data'}", f"algo.epochs={SFT_EPOCHS}", "eval.episodes=0",
           "seed=0", *COMMON]

    def demos() -> str:
        rlinf(where, "collect", "policy=expert", "episodes=4", f"output={where / 'data'}", *COMMON)
        return "4 expert episodes of the default simulator"

    if not checks.run("expert demonstrations to learn from (`rlinf collect policy=expert`)", demos):
        return

    def falls() -> str:
        rlinf(where, *sft, f"run_dir={where / 'a'}")
        rows = metrics(where / "a")
        _finite_rows(rows)
        losses = [float(r["train/loss"]) for r in rows if "train/loss" in r]
        assert len(losses) >= 2, f"the run logged train/loss {len(losses)} time(s) in {SFT_EPOCHS} epochs"
        # by a margin: a loss with no gradient stays level up to the rounding of a reshuffled mean
        assert losses[-1] < losses[0] - 1e-3 * abs(losses[0]), (f"train/loss did not fall over {len(losses)} epochs: "
                                        f"{losses[0]:.4g} first, {losses[-1]:.4g} last")
        assert (where / "a/checkpoints/best/model.safetensors").is_file(), "no best checkpoint was saved"
        return f"train/loss {losses[0]:.4g} -> {losses[-1]:.4g} in {len(losses)} epochs"

    if not checks.run(f"a short `rlinf sft` ({SFT_EPOCHS} epochs): the loss falls", falls):
        return

    def same_seed() -> str:
        rlinf(where, *sft, f"run_dir={where / 'b'}")
        a, b = untimed(metrics(where / "a")), untimed(metrics(where / "b"))
        diff = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None)
        assert len(a) == len(b) and diff is None, f"two runs with seed=0 differ at metrics row {(diff or len(a)) + 1}"
        return f"{len(a)} metrics rows identical"

    checks.run("two runs with one seed log the same metrics", same_seed)
