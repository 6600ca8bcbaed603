"""`rlinf check-sim`: the simulator contract, checked on a plugin author's own simulator.

The same checks back the contract test every registered simulator runs in the test suite.
"""

from __future__ import annotations

import pickle
from typing import Any, Callable

import numpy as np

from rlinf_cli.api import EnvSpec


def _random_action(spec: EnvSpec, rng: np.random.Generator) -> Any:
    if spec.discrete:
        return np.int64(rng.integers(spec.num_actions))
    low = spec.action.low if spec.action.low is not None else -1.0
    high = spec.action.high if spec.action.high is not None else 1.0
    return rng.uniform(low, high, size=spec.action.shape).astype(np.float32)


def check_simulator(sim: Any, steps: int = 20, seed: int = 7) -> list[tuple[str, bool, str]]:
    """Run the contract checks; returns ``(check, passed, detail)`` rows. Never raises for a failed check."""
    rows: list[tuple[str, bool, str]] = []

    def check(name: str, fn: Callable[[], str]) -> bool:
        try:
            rows.append((name, True, fn() or ""))
            return True
        except Exception as exc:  # a failed check is a row in the report, not a crash
            rows.append((name, False, f"{type(exc).__name__}: {exc}"))
            return False

    def spec_ok() -> str:
        assert isinstance(sim.spec, EnvSpec), f"spec is {type(sim.spec).__name__}, not EnvSpec"
        assert sim.spec.observation, "spec.observation is empty"
        if sim.spec.discrete:
            assert sim.spec.action.shape == () and sim.spec.num_actions > 0, "discrete actions need shape () and num_actions"
        return f"obs {({k: v.shape for k, v in sim.spec.observation.items()})}, " + (
            f"{sim.spec.num_actions} discrete actions" if sim.spec.discrete else f"actions {sim.spec.action.shape}")

    if not check("spec is an EnvSpec", spec_ok):
        return rows
    spec: EnvSpec = sim.spec
    check("simulator is picklable (executors ship it to workers)", lambda: str(len(pickle.dumps(sim))) + " bytes")
    env = None

    def make() -> str:
        nonlocal env
        env = sim.make_env(0)
        return type(env).__name__

    if not check("make_env(0)", make):
        return rows
    try:
        def obs_ok() -> str:
            obs, info = env.reset(seed=seed)
            assert isinstance(info, dict), "reset must return (obs, info)"
            assert set(obs) == set(spec.observation), f"obs keys {sorted(obs)} != spec {sorted(spec.observation)}"
            for k, s in spec.observation.items():
                a = np.asarray(obs[k])
                assert a.shape == tuple(s.shape), f"obs['{k}'] shape {a.shape} != spec {s.shape}"
                assert a.dtype == np.dtype(s.dtype), f"obs['{k}'] dtype {a.dtype} != spec {s.dtype}"
            return ""

        def same_seed_same_state() -> str:
            a, _ = env.reset(seed=seed)
            a = {k: np.array(v, copy=True) for k, v in a.items()}
            env.reset(seed=seed + 1)
            b, _ = env.reset(seed=seed)
            for k in a:
                np.testing.assert_array_equal(a[k], b[k], err_msg=f"obs['{k}'] differs after reset(seed={seed}) twice")
            return ""

        def rollout(rng_seed: int) -> list[float]:
            env.reset(seed=seed)
            rng = np.random.default_rng(rng_seed)
            rewards = []
            for _ in range(steps):
                obs, r, term, trunc, info = env.step(_random_action(spec, rng))
                assert isinstance(term, (bool, np.bool_)) and isinstance(trunc, (bool, np.bool_)), "terminated/truncated must be bools"
                assert isinstance(info, dict), "info must be a dict"
                if spec.has_success:
                    assert "success" in info, "spec.has_success is set but info has no 'success'"
                rewards.append(float(r))
                if term or trunc:
                    break
            return rewards

        def deterministic() -> str:
            a, b = rollout(0), rollout(0)
            assert a == b, "same seed and actions gave different rewards"
            return f"{len(a)} steps"

        def expert_ok() -> str:
            expert = sim.expert()
            if expert is None:
                return "no scripted expert (optional)"
            obs, _ = env.reset(seed=seed)
            act = np.asarray(expert(obs, 0))
            assert act.shape == tuple(spec.action.shape), f"expert action shape {act.shape} != spec {spec.action.shape}"
            return "ok"

        check("reset(seed) returns observations matching the spec", obs_ok)
        check("the same seed gives the same initial state", same_seed_same_state)
        check("step() returns (obs, reward, terminated, truncated, info); seeded determinism", deterministic)
        check("expert() (optional)", expert_ok)
    finally:
        if env is not None:
            env.close()
    return rows
