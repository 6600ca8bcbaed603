"""The executor contract: seeded vector envs of CartPole that reset, step and stop as asked."""

from __future__ import annotations

from rlinf_cli.testing.plugins import option, spec_of
from rlinf_cli.testing.report import Check, Checks

ENVS, STEPS = 3, 60


def executor_checks(name: str) -> list[Check]:
    checks = Checks()
    spec = spec_of("executor", name)
    made: list[object] = []

    def construct() -> str:
        made.append(spec.load()(option(spec, "executor")))
        text = made[0].describe()
        assert isinstance(text, str), f"describe() returned {type(text).__name__}; expected str"
        return text

    if not checks.run(f"construction from conf/executor/{name}.yaml; describe()", construct):
        return checks.rows
    checks.run(f"{ENVS} CartPole envs: seeded reset, {STEPS} steps, finished envs stay finished, repeatable",
               lambda: _vec_env(made[0]))
    return checks.rows


def _vec_env(executor: object) -> str:
    import numpy as np

    gym = spec_of("simulator", "gymnasium")
    sim = gym.load()(option(gym, "sim"))
    results = []
    for _ in range(2):
        env = executor.make_vec_env(sim, ENVS, autoreset=False)
        try:
            obs = env.reset([1, 2, 3])
            assert obs["state"].shape == (ENVS, 4), f"reset() gave state of shape {obs['state'].shape}; expected {(ENVS, 4)}"
            rewards = []
            for _ in range(STEPS):
                sb = env.step(np.ones(ENVS, dtype=np.int64))  # always push right: episodes end fast
                rewards.append(sb.reward.copy())
            total = np.sum(rewards, axis=0)
            assert np.all(total < STEPS), f"without autoreset, finished envs kept earning reward: returns {total}"
            results.append(total)
        finally:
            env.close()
    assert np.array_equal(results[0], results[1]), f"the same seeds gave returns {results[0]} then {results[1]}"
    return f"returns {results[0].tolist()}"
