"""The model contract: seeded construction, ``act``/``evaluate``/``get_value`` shapes and agreement,
gradients, a save/load round trip, the KL reference and export, on a discrete and a continuous
action space."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any, Callable

from rlinf_cli.testing.report import Check, Checks, shape_of

BATCH = 6


def env_specs() -> dict[str, Any]:
    """The two action spaces every model is checked on (one vector entry, ``state``)."""
    from rlinf_cli.api import ArraySpec, EnvSpec

    return {
        "discrete": EnvSpec({"state": ArraySpec((4,), "float32")}, ArraySpec((), "int64"), num_actions=3),
        "continuous": EnvSpec({"state": ArraySpec((5,), "float32")}, ArraySpec((2,), "float32", -1.0, 1.0)),
    }


def model_checks(name: str, factory: Callable[..., Any], config: dict[str, Any]) -> list[Check]:
    """Run the contract on ``factory(config, env_spec)``; ``name`` is what ``config.json`` must record."""
    checks = Checks()
    for label, env_spec in env_specs().items():
        _on_spec(checks, f"{label}: ", name, factory, config, env_spec)
    return checks.rows


def _on_spec(checks: Checks, prefix: str, name: str, factory: Callable[..., Any], config: dict[str, Any],
             env_spec: Any) -> None:
    import torch

    models: list[Any] = []

    def construct() -> str:
        built = []
        for _ in range(2):
            torch.manual_seed(0)
            built.append(factory(dict(config), env_spec))
        a, b = built
        sa, sb = a.state_dict(), b.state_dict()
        assert list(sa) == list(sb), "two constructions have different parameters"
        for k in sa:
            assert torch.equal(sa[k], sb[k]), f"parameter '{k}' differs between two constructions under one seed"
        models.append(a)
        return f"{sum(p.numel() for p in a.parameters())} parameters"

    if not checks.run(prefix + "construction from its config is seeded", construct):
        return
    model = models[0]
    n = BATCH
    act_shape = (n, *env_spec.action.shape)
    obs = {"state": torch.randn(n, *env_spec.observation["state"].shape, generator=torch.Generator().manual_seed(1))}
    acted: list[Any] = []

    def act() -> str:
        torch.manual_seed(1)
        out = model.act(obs)
        assert shape_of(out.action) == act_shape, f"act() returned action of shape {shape_of(out.action)}; expected {act_shape}"
        assert shape_of(out.logprob) == (n,), f"act() returned logprob of shape {shape_of(out.logprob)}; expected {(n,)}"
        assert shape_of(out.value) == (n,), f"act() returned value of shape {shape_of(out.value)}; expected {(n,)}"
        assert torch.isfinite(out.logprob).all(), "act() returned a non-finite logprob"
        if env_spec.discrete:
            assert out.action.dtype == torch.int64, f"act() returned {out.action.dtype} discrete actions; expected torch.int64"
            assert ((out.action >= 0) & (out.action < env_spec.num_actions)).all(), \
                f"act() returned a discrete action outside [0, {env_spec.num_actions})"
        acted.append(out)
        return f"action {act_shape}, logprob ({n},), value ({n},)"

    if not checks.run(prefix + "act() shapes", act):
        return
    out = acted[0]

    def evaluate() -> str:
        ev = model.evaluate(obs, out.action)
        for field in ("logprob", "entropy", "value"):
            got = shape_of(getattr(ev, field))
            assert got == (n,), f"evaluate() returned {field} of shape {got}; expected {(n,)}"
        gap = float((ev.logprob.detach() - out.logprob.detach()).abs().max())
        assert gap < 1e-4, f"evaluate() scores the actions act() took {gap:.3g} away from act()'s logprob"
        return "logprob, entropy and value agree with act()"

    def get_value() -> str:
        v = model.get_value(obs)
        assert shape_of(v) == (n,), f"get_value() returned shape {shape_of(v)}; expected {(n,)}"
        return ""

    def deterministic() -> str:
        a, b = model.act(obs, deterministic=True).action, model.act(obs, deterministic=True).action
        assert torch.equal(a, b), "act(deterministic=True) gave two different actions for one observation"
        return ""

    def gradients() -> str:
        model.zero_grad(set_to_none=True)
        model.evaluate(obs, out.action).logprob.sum().backward()
        reached = [p for p in model.parameters() if p.grad is not None and bool(p.grad.abs().sum() > 0)]
        assert reached, "evaluate()'s logprob carries no gradient to any parameter (is it detached?)"
        model.zero_grad(set_to_none=True)
        return f"{len(reached)} parameter tensor(s) receive a gradient"

    def observation_keys() -> str:
        keys = tuple(model.observation_keys)
        extra = sorted(set(keys) - set(env_spec.observation))
        assert not extra, f"observation_keys names {extra}, which the simulator does not give"
        return f"reads {list(keys)}"

    def round_trip() -> str:
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "m"
            model.save_pretrained(path)
            cfg = json.loads((path / "config.json").read_text())
            assert cfg.get("model", {}).get("name") == name, \
                f"config.json records model name {cfg.get('model', {}).get('name')!r}; expected {name!r}"
            loaded = type(model).from_pretrained(path)
            a = model.evaluate(obs, out.action).logprob
            b = loaded.evaluate(obs, out.action).logprob
            assert torch.allclose(a, b, rtol=1.3e-6, atol=1e-5), "a model loaded with from_pretrained() scores actions differently"
        return "save_pretrained + from_pretrained give the same model"

    def reference() -> str:
        ref = model.reference(model)
        a = model.evaluate(obs, out.action).logprob.detach()
        b = ref.evaluate(obs, out.action).logprob
        assert torch.allclose(a, b, rtol=1.3e-6, atol=1e-5), "reference(start=model) scores actions unlike the model"
        trainable = [n for n, q in ref.named_parameters() if q.requires_grad] if isinstance(ref, torch.nn.Module) else []
        assert not trainable, f"the reference is not frozen: {trainable[:3]} require gradients"
        return f"{type(ref).__name__}, frozen"

    def export() -> str:
        with tempfile.TemporaryDirectory() as tmp:
            what = model.export(Path(tmp) / "out")
            assert isinstance(what, str) and what, f"export() returned {what!r}; expected a few words saying what it wrote"
            assert any((Path(tmp) / "out").iterdir()), "export() wrote nothing into its directory"
        return what

    checks.run(prefix + "evaluate() re-scores act()'s actions", evaluate)
    checks.run(prefix + "get_value() shape", get_value)
    checks.run(prefix + "act(deterministic=True) is repeatable", deterministic)
    checks.run(prefix + "gradients reach the parameters", gradients)
    checks.run(prefix + "observation_keys are entries the simulator gives", observation_keys)
    checks.run(prefix + "save_pretrained / from_pretrained round trip", round_trip)
    checks.run(prefix + "reference() (a KL term's frozen start) scores like the model", reference)
    checks.run(prefix + "export() writes the policy", export)
