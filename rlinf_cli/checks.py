"""`rlinf check-sim`: the simulator contract, checked on a plugin author's own simulator.

The same checks back the contract test every registered simulator runs in the test suite.
"""

from __future__ import annotations

import pickle
from typing import Any, Callable

import numpy as np

from rlinf_cli.api import EnvSpec
from rlinf_cli.registry import get_registry
from rlinf_cli.toolcalls import CALL_OPEN, parse_call


def _checker(rows: list[tuple[str, bool, str]]) -> Callable[[str, Callable[[], str]], bool]:
    """``check(name, fn)``: runs ``fn`` and appends its row; a failed check is a row, not a crash."""
    def check(name: str, fn: Callable[[], str]) -> bool:
        try:
            rows.append((name, True, fn() or ""))
            return True
        except Exception as exc:
            rows.append((name, False, f"{type(exc).__name__}: {exc}"))
            return False

    return check


def check_simulator(sim: Any, steps: int = 20, seed: int = 7) -> list[tuple[str, bool, str]]:
    """Run the contract checks; returns ``(check, passed, detail)`` rows. Never raises for a failed check."""
    rows: list[tuple[str, bool, str]] = []
    check = _checker(rows)

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
                if s.is_text:
                    assert isinstance(obs[k], str), f"obs['{k}'] is a text entry: expected a str, got {type(obs[k]).__name__}"
                    continue
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
                obs, r, term, trunc, info = env.step(spec.random_actions(rng))
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

        def replayable() -> str:
            if not spec.replayable:
                return "replayable=False: a resumed run starts fresh episodes"
            rng = np.random.default_rng(1)
            actions = [spec.random_actions(rng) for _ in range(steps)]

            def trace(e: Any) -> list[dict[str, np.ndarray]]:
                obs, _ = e.reset(seed=seed)
                out = [{k: np.array(v, copy=True) for k, v in obs.items()}]
                for a in actions:
                    obs, _, term, trunc, _ = e.step(a)
                    out.append({k: np.array(v, copy=True) for k, v in obs.items()})
                    if term or trunc:
                        break
                return out

            first = trace(env)
            fresh = sim.make_env(0)  # as in a resumed process: a new instance of the same env
            try:
                second = trace(fresh)
            finally:
                fresh.close()
            assert len(first) == len(second), "the replayed episode ended at another step"
            for t, (a, b) in enumerate(zip(first, second)):
                for k in a:
                    np.testing.assert_array_equal(a[k], b[k], err_msg=f"obs['{k}'] differs at step {t} of the replay "
                                                  "(set EnvSpec(replayable=False) if the simulator cannot be replayed)")
            return f"{len(first) - 1} steps replayed on a new instance"

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
        check("reset(seed) + the same actions replay an episode exactly (resume relies on it)", replayable)
        check("expert() (optional)", expert_ok)
    finally:
        if env is not None:
            env.close()
    if is_batched(sim):
        check("a batch of 4 envs in one engine: shapes, dtypes, flags, seeds", lambda: _check_batch(sim, steps, seed))
    return rows


def is_batched(sim: Any) -> bool:
    """A batched simulator, here (``make_batched_env``) or behind an env server (``sim=remote``)."""
    from rlinf_cli.api import BatchedSimulator, HostedSimulator

    return isinstance(sim, BatchedSimulator) or (isinstance(sim, HostedSimulator) and bool(getattr(sim, "batched", False)))


def _check_batch(sim: Any, steps: int, seed: int, n: int = 4) -> str:
    """The batched path the runtime takes (:func:`~rlinf_cli.runtime.hosting.hosted_vec_env`)."""
    from rlinf_cli.runtime.placement import runtime_config
    from rlinf_cli.runtime.hosting import hosted_vec_env

    spec: EnvSpec = sim.spec
    env = hosted_vec_env(sim, runtime_config(None), n, True, "check-sim")
    try:
        seeds = [seed, seed, seed + 1, seed + 1]
        obs = env.reset(seeds)
        for k, s in spec.observation.items():
            if s.is_text:
                continue
            assert obs[k].shape == (n, *s.shape) and obs[k].dtype == np.dtype(s.dtype), \
                f"obs['{k}'] is {obs[k].dtype}{list(obs[k].shape)}, spec says {s.dtype}{[n, *s.shape]}"
        if spec.per_env_seeds:
            for k in obs:
                np.testing.assert_array_equal(obs[k][0], obs[k][1], err_msg=f"obs['{k}']: two envs reset with one "
                                              "seed differ (set EnvSpec(per_env_seeds=False) if the batch is seeded as a whole)")
        again = env.reset(seeds)
        for k in obs:
            np.testing.assert_array_equal(obs[k], again[k], err_msg=f"obs['{k}'] differs after the same reset twice")
        rng = np.random.default_rng(0)
        ended = 0
        for _ in range(steps):
            sb = env.step(spec.random_actions(rng, n))
            assert sb.reward.shape == (n,) and sb.reward.dtype == np.float32, f"reward {sb.reward.dtype}{sb.reward.shape}"
            assert sb.terminated.dtype == bool and sb.truncated.dtype == bool and sb.terminated.shape == (n,)
            assert not (sb.terminated & sb.truncated).any(), "an env both terminated and truncated"
            assert np.isfinite(sb.reward).all(), "non-finite reward"
            ended += int((sb.terminated | sb.truncated).sum())
        return (f"{steps} batched steps, {ended} episode(s) ended" + ("" if spec.per_env_seeds else
                "; per_env_seeds=False: the batch is seeded as a whole (no GRPO groups)"))
    finally:
        env.close()


def check_text_task(task: Any, n: int = 50) -> list[tuple[str, bool, str]]:
    """The text-task contract (``modality="text"``): same rows as :func:`check_simulator`."""
    from rlinf_cli.api import Score, TextSample, TextTask

    rows: list[tuple[str, bool, str]] = []
    check = _checker(rows)

    def protocol() -> str:
        assert isinstance(task, TextTask), "missing TextTask attributes or methods (see rlinf_cli/api.py)"
        assert task.max_new_tokens > 0 and task.max_turns >= 1, "max_new_tokens and max_turns must be positive"
        return f"max_new_tokens={task.max_new_tokens}, max_turns={task.max_turns}, stop={tuple(task.stop)}"

    def by_seed() -> str:
        a, b = task.prompts(list(range(n))), task.prompts(list(range(n)))
        assert a == b, "the same seeds gave different prompts"
        assert len(a) == n and all(isinstance(s, TextSample) and s.prompt for s in a), "one non-empty TextSample per seed"
        return f"{len({s.prompt for s in a})} distinct prompts in {n} seeds"

    def held_out() -> str:
        train = {s.prompt for s in task.prompts(list(range(4 * n)))}
        held = {s.prompt for s in task.prompts(list(range(1_000_000, 1_000_000 + n)))}
        assert not train & held, f"{len(train & held)} eval prompts (seeds >= 1,000,000) also appear among training seeds"
        return "eval seeds draw prompts training seeds never do"

    def solutions() -> str:
        samples = [s for s in task.prompts(list(range(n))) if s.solution]
        bad = [s for s in samples if not task.score(s, s.solution).correct]
        assert not bad, f"the reference solution of {bad[0].prompt!r} does not score as correct"
        assert all(isinstance(task.score(s, ""), Score) and not task.score(s, "").correct for s in samples[:5]), \
            "an empty completion scored as correct"
        return f"{len(samples)} reference solutions score correct; empty completions do not"

    def tools() -> str:
        s = task.prompts([0])[0]
        reply = task.tool_response(s, s.solution)
        assert reply is None or isinstance(reply, str), "tool_response must return str or None"
        names = [str(n) for n in getattr(task, "tools", None) or ()]
        missing = [n for n in names if n not in get_registry().specs("tool")]
        assert not missing, f"sim.tools names tools no installed plugin registers: {', '.join(missing)}"
        calls = [parse_call(CALL_OPEN + part) for part in s.solution.split(CALL_OPEN)[1:]]
        bad = [c for c in calls if c is None or c.error or c.name not in names]
        assert not bad, f"the reference solution makes a call that is malformed or names no tool of the task: {bad[0]}"
        said = f"tools {', '.join(names)}; reference calls {len(calls)}" if names else "no tools"
        return f"{said}; " + ("no tool turn after the final answer" if reply is None else f"tool reply: {reply[:40]!r}")

    def picklable() -> str:
        pickle.loads(pickle.dumps(task))
        return ""

    for name, fn in (("text-task protocol", protocol), ("prompts by seed", by_seed), ("held-out eval seeds", held_out),
                     ("reference solutions", solutions), ("tool turns", tools), ("picklable", picklable)):
        check(name, fn)
    return rows
