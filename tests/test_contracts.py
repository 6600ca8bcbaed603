"""One contract test per registered plugin: construction, a tiny run, seeded determinism, save/load.

Parametrised over whatever is installed, so a new plugin is covered the moment it registers.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

from rlinf_cli.api import ArraySpec, EnvSpec
from rlinf_cli.registry import get_registry


def _specs(kind: str):
    return sorted(get_registry().specs(kind).values(), key=lambda s: s.name)


def _option(spec, group: str) -> dict:
    """The plugin's own config option (conf/<group>/<name>.yaml)."""
    path = spec.conf_dir / group / f"{spec.name}.yaml"
    assert path.is_file(), f"{spec.package} ships no {group}/{spec.name}.yaml"
    node = OmegaConf.to_container(OmegaConf.load(path), resolve=True)
    assert node["name"] == spec.name
    return node


def _embodied(kind):
    return [s for s in _specs(kind) if not s.attrs.get("modality") == "text"]


def _marked(specs):
    """Plugins whose component needs an opt-in install name a pytest marker (``test_marker``):
    their contract test runs under it (e.g. ``make test-libero``), not in ``make test``."""
    return [pytest.param(s, marks=getattr(pytest.mark, s.attrs["test_marker"])) if s.attrs.get("test_marker") else s
            for s in specs]


@pytest.mark.parametrize("spec", _marked(_embodied("simulator")), ids=lambda s: s.name)
def test_simulator_contract(spec):
    """The checks of `rlinf check-sim`: spec, pickling, reset/step shapes, seeded determinism, expert."""
    from rlinf_cli.checks import check_simulator

    option = _option(spec, "sim")
    if spec.attrs.get("hosted"):  # envs on an env server (sim=remote): serve the default simulator to it
        from rlinf_cli.remote.server import EnvServer, ServeConfig

        default = next(s for s in _embodied("simulator") if s.default)
        server = EnvServer(default.load()(_option(default, "sim")), ServeConfig(port=0), default.name)
        option["address"] = f"127.0.0.1:{server.start()}"
        try:
            rows = check_simulator(spec.load()(option))
        finally:
            server.stop(grace=0)
    else:
        rows = check_simulator(spec.load()(option))
    failed = [r for r in rows if not r[1]]
    assert len(rows) == 8 and not failed, failed


class _DriftingSim:
    """Breaks the contract: its observation shape disagrees with its spec and reset ignores the seed."""

    spec = EnvSpec({"state": ArraySpec((3,), "float32")}, ArraySpec((), "int64"), num_actions=2)

    class _Env:
        def reset(self, *, seed=None):
            return {"state": np.random.rand(4).astype(np.float32)}, {}

        def step(self, a):
            return {"state": np.random.rand(4).astype(np.float32)}, float(np.random.rand()), False, False, {}

        def close(self):
            pass

    def make_env(self, index):
        return self._Env()

    def expert(self):
        return None


def test_check_sim_catches_a_broken_simulator():
    from rlinf_cli.checks import check_simulator

    rows = {name: (ok, detail) for name, ok, detail in check_simulator(_DriftingSim())}
    assert rows["reset(seed) returns observations matching the spec"][0] is False
    assert "shape (4,) != spec (3,)" in rows["reset(seed) returns observations matching the spec"][1]
    assert rows["the same seed gives the same initial state"][0] is False
    assert rows["step() returns (obs, reward, terminated, truncated, info); seeded determinism"][0] is False
    assert rows["reset(seed) + the same actions replay an episode exactly (resume relies on it)"][0] is False


SPECS = {
    "discrete": EnvSpec({"state": ArraySpec((4,), "float32")}, ArraySpec((), "int64"), num_actions=3),
    "continuous": EnvSpec({"state": ArraySpec((5,), "float32")}, ArraySpec((2,), "float32", -1.0, 1.0)),
}


@pytest.mark.parametrize("kind", list(SPECS))
@pytest.mark.parametrize("spec", _embodied("model"), ids=lambda s: s.name)
def test_model_contract(spec, kind, tmp_path):
    env_spec = SPECS[kind]
    factory = spec.load()
    torch.manual_seed(0)
    a = factory(_option(spec, "model"), env_spec)
    torch.manual_seed(0)
    b = factory(_option(spec, "model"), env_spec)
    for pa, pb in zip(a.state_dict().values(), b.state_dict().values()):
        torch.testing.assert_close(pa, pb)  # seeded construction is deterministic
    obs = {"state": torch.randn(6, *env_spec.observation["state"].shape)}
    torch.manual_seed(1)
    out = a.act(obs)
    assert out.action.shape == (6, *env_spec.action.shape) and out.logprob.shape == (6,) and out.value.shape == (6,)
    ev = a.evaluate(obs, out.action)
    torch.testing.assert_close(ev.logprob, out.logprob)  # the same actions score the same
    det1, det2 = a.act(obs, deterministic=True).action, a.act(obs, deterministic=True).action
    torch.testing.assert_close(det1, det2)
    a.save_pretrained(tmp_path / "m")
    cfg = json.loads((tmp_path / "m" / "config.json").read_text())
    assert cfg["model"]["name"] == spec.name
    loaded = factory.from_pretrained(tmp_path / "m")
    torch.testing.assert_close(loaded.evaluate(obs, out.action).logprob, ev.logprob)


def _tiny_rl(algo_spec) -> list[str]:
    node = _option(algo_spec, "algo")
    args = [f"algo={algo_spec.name}", "num_envs=2", "eval.episodes=1", "tracking.enabled=false", "checkpoint.interval=1",
            "checkpoint.keep=5", "seed=3", "progress=false"]
    if "rollout_steps" in node:
        args.append("algo.rollout_steps=16")
    if "group_size" in node:
        args += ["algo.group_size=2", "algo.groups=1"]
    if node.get("minibatch_size"):
        args.append("algo.minibatch_size=16")
    if "warmup_steps" in node:  # off-policy: learn within the tiny budget, from a small buffer
        args += ["algo.warmup_steps=8", "algo.buffer_size=1000"]
    if not _accepts_default_sim(algo_spec):
        args.append("sim.env_id=Pendulum-v1")  # continuous actions (the default CartPole's are discrete)
    return args


def _accepts_default_sim(algo_spec) -> bool:
    """The algorithm's own ``check`` accepts the default simulator (CartPole)."""
    from rlinf_cli.errors import UserError
    from rlinf_cli.registry import make_simulator

    algo = algo_spec.load().from_config(_option(algo_spec, "algo"))
    try:
        algo.check(make_simulator({"name": "gymnasium", "env_id": "CartPole-v1"}).spec)
    except UserError:
        return False
    return True


@pytest.mark.parametrize("spec", [s for s in _specs("algorithm") if s.load().rollout != "supervised"
                                  and s.attrs.get("modality") != "text"], ids=lambda s: s.name)
def test_rl_algorithm_contract(spec, cli, workdir):
    """Two seeded runs agree; a run resumed from its first checkpoint ends where the full run ends."""
    args = _tiny_rl(spec) + ["total_steps=60"]
    if not spec.load().uses_critic:
        args.append("model.critic=false")
    for run in ("a", "b"):
        res = cli("rl", *args, f"run_dir={run}")
        assert res.code == 0, res.err
    rows = [json.loads((workdir / r / "metrics.jsonl").read_text().splitlines()[0]) for r in ("a", "b")]
    drop = lambda row: {k: v for k, v in row.items() if not k.startswith("time/")}  # noqa: E731
    assert drop(rows[0]) == drop(rows[1])
    state = json.loads((workdir / "a/checkpoints/final/trainer_state.json").read_text())
    assert state["iteration"] >= 2, "the tiny run should take at least two iterations"
    res = cli("rl", f"resume={workdir / 'a/checkpoints/iter_000001'}", "run_dir=c")
    assert res.code == 0, res.err
    from safetensors.torch import load_file

    full = load_file(str(workdir / "a/checkpoints/final/model.safetensors"))
    resumed = load_file(str(workdir / "c/checkpoints/final/model.safetensors"))
    for k in full:
        torch.testing.assert_close(full[k], resumed[k], rtol=0, atol=0)


@pytest.mark.parametrize("spec", [s for s in _specs("algorithm") if s.load().rollout == "supervised"
                                  and s.attrs.get("modality") != "text"], ids=lambda s: s.name)
def test_supervised_algorithm_contract(spec, cli, workdir):
    res = cli("collect", "policy=expert", "episodes=4", "output=data", "tracking.enabled=false", "progress=false")
    assert res.code == 0, res.err
    for run in ("a", "b"):
        res = cli("sft", f"algo={spec.name}", "dataset=data", "algo.epochs=2", "eval.episodes=0",
                  "tracking.enabled=false", f"run_dir={run}", "progress=false")
        assert res.code == 0, res.err
    rows = [(workdir / r / "metrics.jsonl").read_text().splitlines() for r in ("a", "b")]
    assert rows[0] == rows[1]
    assert (workdir / "a/checkpoints/best/model.safetensors").is_file()


@pytest.mark.parametrize("spec", _specs("accelerator"), ids=lambda s: s.name)
def test_accelerator_contract(spec):
    accel = spec.load()()
    assert isinstance(accel.describe(), str) and accel.describe()
    available = accel.is_available()
    assert isinstance(available, bool)
    if available:
        x = torch.ones(3, device=accel.device())
        assert float((x * 2).sum()) == 6.0
        assert isinstance(accel.dist_backend(), str)
        assert isinstance(accel.memory_stats(), dict)


@pytest.mark.parametrize("spec", _specs("executor"), ids=lambda s: s.name)
def test_executor_contract(spec):
    gym_spec = get_registry().get("simulator", "gymnasium")
    sim = gym_spec.load()(_option(gym_spec, "sim"))
    executor = spec.load()(_option(spec, "executor"))
    assert isinstance(executor.describe(), str)
    results = []
    for _ in range(2):
        env = executor.make_vec_env(sim, 3, autoreset=False)
        try:
            obs = env.reset([1, 2, 3])
            assert obs["state"].shape == (3, 4)
            rewards = []
            for _ in range(60):
                sb = env.step(np.ones(3, dtype=np.int64))  # always push right: episodes end fast
                rewards.append(sb.reward.copy())
            total = np.sum(rewards, axis=0)
            assert np.all(total < 60)  # finished envs stay finished without autoreset
            results.append(total)
        finally:
            env.close()
    np.testing.assert_array_equal(results[0], results[1])
