"""Running normalization of observations and rewards (rlinf_cli/runtime/normalize.py): what is
normalized, ranks agreeing on one set of statistics, statistics in checkpoints, used frozen by
`eval`, and exact resume with normalization on."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import numpy as np
import pytest

from rlinf_cli.api import ArraySpec, EnvSpec
from rlinf_cli.runtime.normalize import FILE, NormalizeConfig, Normalizer, RunningMeanStd
from tests.conftest import RLINF

pytestmark = pytest.mark.numerics  # results depend on CPU features: make test-portable runs them again

SPEC = EnvSpec(observation={"state": ArraySpec((3,), "float32"), "rgb": ArraySpec((4, 4, 3), "uint8"),
                            "task_id": ArraySpec((), "int64"), "instruction": ArraySpec((), "str")},
               action=ArraySpec((2,), "float32", low=-1.0, high=1.0), max_episode_steps=10)


def _obs(rng: np.random.Generator, n: int) -> dict:
    return {"state": (rng.normal(size=(n, 3)) * [1.0, 10.0, 100.0] + [5.0, -3.0, 0.0]).astype(np.float32),
            "rgb": rng.integers(0, 256, size=(n, 4, 4, 3), dtype=np.uint8),
            "task_id": np.zeros(n, np.int64), "instruction": np.array(["push"] * n, dtype=object)}


def test_running_mean_std_matches_numpy_over_batches():
    rng = np.random.default_rng(0)
    data = rng.normal(size=(1000, 3)) * [1, 5, 0.1] + [2, -1, 7]
    rms = RunningMeanStd((3,), count=0)
    for chunk in np.array_split(data, 37):
        rms.update(chunk)
    np.testing.assert_allclose(rms.mean, data.mean(0), rtol=1e-10)
    np.testing.assert_allclose(rms.var, data.var(0), rtol=1e-10)
    assert rms.count == 1000


def test_batch_statistics_are_numpys_bit_for_bit():
    """update() computes a batch's mean and variance inline (it runs every env step); the numbers
    must be np.mean's and np.var's exactly, so that runs repeat what they gave before."""
    rng = np.random.default_rng(3)
    for shape in [(8, 17), (1, 11), (8,), (3, 4, 5), (256, 105)]:
        x = rng.normal(size=shape) * rng.uniform(0.01, 100.0) + rng.uniform(-50.0, 50.0)
        ours, ref = RunningMeanStd(shape[1:]), RunningMeanStd(shape[1:])
        for _ in range(3):
            ours.update(x)
            ref.merge(x.mean(axis=0), x.var(axis=0), float(len(x)))
            assert np.array_equal(ours.mean, ref.mean) and np.array_equal(ours.var, ref.var), shape


def test_only_float_entries_are_normalized_and_clipped():
    rng = np.random.default_rng(1)
    norm = Normalizer(SPEC, NormalizeConfig(obs=True, clip_obs=5.0), num_envs=4)
    assert norm.keys == ["state"]  # never images, integer ids or text
    for _ in range(200):
        out = norm.observe(_obs(rng, 4))
    for k in ("rgb", "task_id", "instruction"):
        assert out[k] is not None and out[k].dtype == _obs(rng, 1)[k].dtype
    late = np.concatenate([norm.observe(_obs(rng, 4), update=False)["state"] for _ in range(200)])
    assert late.dtype == np.float32
    np.testing.assert_allclose(late.mean(0), 0.0, atol=0.15)  # every dimension on the same scale
    np.testing.assert_allclose(late.std(0), 1.0, atol=0.15)
    far = norm.observe({**_obs(rng, 1), "state": np.array([[1e6, -1e6, 0.0]], np.float32)}, update=False)["state"]
    assert far[0, 0] == 5.0 and far[0, 1] == -5.0


def test_rewards_scaled_by_the_std_of_the_discounted_return_not_shifted():
    norm = Normalizer(SPEC, NormalizeConfig(reward=True, gamma=0.9), num_envs=2)
    done = np.array([False, False])
    rets = []
    ret = np.zeros(2)
    for t in range(300):
        r = np.array([100.0, 300.0], np.float32)
        end = done | (t % 50 == 49)
        scaled = norm.reward(r, end)
        ret = ret * 0.9 + r
        rets.append(ret.copy())
        ret = np.where(end, 0.0, ret)
    assert (scaled > 0).all()  # the sign of a reward never flips
    expected = r / np.sqrt(np.var(np.concatenate(rets)) + 1e-8)
    np.testing.assert_allclose(scaled, expected, rtol=0.01)
    frozen = norm.frozen_copy()
    before = frozen.ret_rms.var.copy()
    frozen.reward(np.array([1e4, 1e4], np.float32), done)
    assert frozen.ret_rms.var == before  # evaluation never moves the statistics


def test_ranks_agree_on_statistics_equal_to_one_process_seeing_all_data():
    rng = np.random.default_rng(2)
    cfg = NormalizeConfig(obs=True, reward=True)
    ranks = [Normalizer(SPEC, cfg, num_envs=2) for _ in range(2)]
    single = Normalizer(SPEC, cfg, num_envs=4)
    for r in ranks:
        r.track_ranks()
    for _ in range(5):  # five rollouts, a sync after each
        batches = [_obs(rng, 2) for _ in ranks]
        for r, b in zip(ranks, batches):
            for _ in range(3):
                r.observe(b)
                r.reward(np.array([1.0, 2.0], np.float32), np.array([False, False]))
        deltas = [{k: (v.mean, v.var, v.count) for k, v in r._delta.items()} for r in ranks]
        for r in ranks:
            r.sync(gather=lambda _mine: deltas)
        for _ in range(3):
            single.observe({k: np.concatenate([b[k] for b in batches]) for k in batches[0]})
    a, b = ranks[0].state(), ranks[1].state()
    assert a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)  # bit-identical on every rank
    np.testing.assert_allclose(a["state.mean"], single.state()["state.mean"], rtol=1e-9)
    np.testing.assert_allclose(a["state.var"], single.state()["state.var"], rtol=1e-9)
    assert a["state.count"][0] == pytest.approx(single.state()["state.count"][0])


def test_statistics_round_trip_through_a_file(tmp_path):
    rng = np.random.default_rng(3)
    norm = Normalizer(SPEC, NormalizeConfig(obs=True, reward=True, clip_obs=7.0), num_envs=2)
    for _ in range(20):
        norm.observe(_obs(rng, 2))
        norm.reward(rng.normal(size=2).astype(np.float32), np.array([False, True]))
    norm.save(tmp_path)
    back = Normalizer.load(tmp_path, SPEC)
    assert back is not None and back.frozen and back.config == norm.config
    s, t = norm.state(), back.state()
    assert all(np.array_equal(s[k], t[k]) for k in s)
    probe = _obs(rng, 3)
    np.testing.assert_array_equal(norm.observe(probe, update=False)["state"], back.observe(probe)["state"])
    assert Normalizer.load(tmp_path / "nothing", SPEC) is None


# -- end to end ----------------------------------------------------------------------------------
ARGS = ["sim=gymnasium", "sim.env_id=Pendulum-v1", "num_envs=2", "algo.rollout_steps=16", "algo.epochs=2",
        "algo.minibatch_size=16", "total_steps=384", "env.normalize_obs=true", "env.normalize_reward=true",
        "tracking.enabled=false", "progress=false", "eval.episodes=3", "seed=3"]


def _run(*args: str) -> subprocess.CompletedProcess:
    res = subprocess.run([RLINF, *args], capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    return res


def _metrics(run_dir: Path) -> list[dict]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if not (k.startswith("time/") or k.endswith("_s"))} for r in rows]


def test_checkpoint_holds_the_statistics_resume_is_exact_and_eval_uses_them_frozen(workdir):
    from safetensors.numpy import load_file

    _run("rl", *ARGS, "checkpoint.interval=3", "checkpoint.keep=100", "run_dir=a")
    full = _metrics(workdir / "a")
    assert len(full) == 1 + 12 + 1  # the start's validation (eval.best), the iterations, the final eval
    # Pendulum's 200-step episodes run through every checkpoint: resume replays them, and the
    # statistics and running discounted returns come back from the checkpoint
    _run("rl", f"resume={workdir / 'a/checkpoints/iter_000006'}", "run_dir=b")
    assert _metrics(workdir / "b") == full[7:]
    final = workdir / "a/checkpoints/final"
    stats = load_file(str(final / FILE))
    assert stats["state.count"][0] > 300  # it learned from the run's observations
    again = load_file(str(workdir / "b/checkpoints/final" / FILE))
    assert all(np.array_equal(stats[k], again[k]) for k in stats)

    # `eval` on the checkpoint: the same held-out episodes as the run's own final evaluation
    res = _run("eval", "sim=gymnasium", "sim.env_id=Pendulum-v1", f"checkpoint={final}", "episodes=3",
               "tracking.enabled=false", "progress=false", "run_dir=e1")
    evaluated = json.loads((workdir / "e1/result.json").read_text())["eval"]["return_mean"]
    trained = json.loads((workdir / "a/result.json").read_text())["eval"]["return_mean"]
    # the same frozen statistics, to float32 rounding: the two processes' sums may differ in the last
    # bits (2e-6 on -940 with MKL_CBWR=COMPATIBLE, two threads: make test-portable); statistics
    # that moved or were missing change the return by far more
    assert evaluated == pytest.approx(trained, rel=1e-6), res.stderr
    after = load_file(str(final / FILE))
    assert all(np.array_equal(stats[k], after[k]) for k in stats)  # frozen: eval changed nothing
    # and they matter: the same weights without the statistics act differently
    raw = workdir / "raw"
    raw.mkdir()
    for f in ("model.safetensors", "config.json"):
        (raw / f).write_bytes((final / f).read_bytes())
    _run("eval", "sim=gymnasium", "sim.env_id=Pendulum-v1", f"checkpoint={raw}", "episodes=3",
         "tracking.enabled=false", "progress=false", "run_dir=e2")
    assert json.loads((workdir / "e2/result.json").read_text())["eval"]["return_mean"] != pytest.approx(evaluated)


def test_collect_with_a_checkpoint_records_raw_observations(workdir):
    """Datasets keep the env's own units; the checkpoint's policy acts through its statistics."""
    _run("rl", *ARGS, "total_steps=64", "run_dir=a")
    final = workdir / "a/checkpoints/final"
    _run("collect", "sim=gymnasium", "sim.env_id=Pendulum-v1", f"policy={final}", "episodes=2", "output=data",
         "tracking.enabled=false", "progress=false", "run_dir=c")
    import pyarrow.parquet as pq

    table = pq.read_table(next((workdir / "data").rglob("*.parquet")))
    cols = [c for c in table.column_names if "state" in c]
    state = np.asarray(table.column(cols[0]).to_pylist(), dtype=np.float64)
    assert np.abs(state).max() > 1.5  # Pendulum's angular velocity is raw (up to 8), not normalized


def test_bad_normalization_settings_give_one_line(cli):
    res = cli("rl", *ARGS, "env.clip_obs=0", "run_dir=x")
    assert res.code == 2 and "env.clip_obs" in res.err and "Traceback" not in res.err
    res = cli("rl", *ARGS, "runtime.overlap_update=true", "run_dir=y")
    assert res.code == 2 and "overlap_update" in res.err and "Traceback" not in res.err


def test_rl_init_from_a_checkpoint_keeps_its_statistics(workdir):
    """init= a normalized checkpoint: its statistics continue (or, normalization off, stay frozen);
    init= a checkpoint without statistics refuses env.normalize_obs=true (its policy expects raw
    observations)."""
    from safetensors.numpy import load_file

    _run("rl", *ARGS, "total_steps=64", "run_dir=a")
    final = workdir / "a/checkpoints/final"
    res = _run("rl", *ARGS, "total_steps=64", f"init={final}", "run_dir=b")
    assert "continuing the checkpoint's running statistics" in res.stderr
    before, after = load_file(str(final / FILE)), load_file(str(workdir / "b/checkpoints/final" / FILE))
    assert after["state.count"][0] == pytest.approx(before["state.count"][0] + 64, abs=1e-3)
    auto = [a for a in ARGS if not a.startswith("env.normalize")]  # the default: auto
    res = _run("rl", *auto, "total_steps=64", f"init={final}", "run_dir=auto")
    assert "=auto -> as the checkpoint was trained" in res.stderr
    assert "continuing the checkpoint's running statistics" in res.stderr
    off = [*auto, "env.normalize_obs=false", "env.normalize_reward=false"]
    res = _run("rl", *off, "total_steps=64", f"init={final}", "run_dir=c")
    assert "used frozen" in res.stderr
    frozen = load_file(str(workdir / "c/checkpoints/final" / FILE))
    assert all(np.array_equal(before[k], frozen[k]) for k in before)
    _run("rl", *off, "total_steps=64", "run_dir=raw")
    res = subprocess.run([RLINF, "rl", *ARGS, "total_steps=64", f"init={workdir / 'raw/checkpoints/final'}",
                          "run_dir=d"], capture_output=True, text=True, timeout=300)
    assert res.returncode == 2 and "expects raw observations" in res.stderr and "Traceback" not in res.stderr
    # auto with a checkpoint without statistics (a cloned policy, as `rlinf sft` writes): off
    res = _run("rl", *auto, "total_steps=64", f"init={workdir / 'raw/checkpoints/final'}", "run_dir=e")
    assert "=auto -> off: the checkpoint has no statistics" in res.stderr
    assert not (workdir / "e/checkpoints/final" / FILE).exists()


class _Sim:
    def __init__(self, recommends: bool | None):
        if recommends is not None:
            self.normalize_default = recommends


@pytest.mark.parametrize("env,sim,ckpt,from_ckpt,overlap,want", [
    ({}, _Sim(True), None, False, False, (True, True)),  # the default, where the simulator recommends it
    ({}, _Sim(False), None, False, False, (False, False)),
    ({}, _Sim(None), None, False, False, (False, False)),  # a simulator that says nothing: off
    ({"normalize_obs": False}, _Sim(True), None, False, False, (False, True)),  # explicit wins, per switch
    ({"normalize_reward": True}, _Sim(False), None, False, False, (False, True)),
    ({}, _Sim(True), None, True, False, (False, False)),  # a checkpoint without statistics (init=, resume)
    ({}, _Sim(True), None, False, True, (False, False)),  # overlap_update cannot share statistics
    ({}, _Sim(False), NormalizeConfig(obs=True), True, False, (True, False)),  # as the checkpoint was trained
    ({}, _Sim(True), None, False, "sac", (False, False)),  # an algorithm that opts out (normalize_auto = False)
    ({"normalize_obs": True}, _Sim(True), None, False, "sac", (True, False)),  # ... unless asked
    ({}, _Sim(True), None, False, "ppo", (True, True)),
])
def test_auto_resolves_from_checkpoint_then_algorithm_then_simulator(env, sim, ckpt, from_ckpt, overlap, want):
    from rlinf_cli.registry import get_registry
    from rlinf_cli.runtime.normalize import resolve

    algo = get_registry().load("algorithm", overlap) if isinstance(overlap, str) else None
    checkpoint = Normalizer(SPEC, ckpt) if ckpt is not None else None
    cfg, why = resolve(env, sim, checkpoint, from_ckpt, overlap is True, algo)
    assert (cfg.obs, cfg.reward) == want
    assert why is not None and "=auto ->" in why


def test_auto_is_not_a_boolean_to_guess(cli):
    from rlinf_cli.runtime.normalize import resolve

    cfg, why = resolve({"normalize_obs": True, "normalize_reward": False}, _Sim(False), None, False)
    assert (cfg.obs, cfg.reward, why) == (True, False, None)  # nothing left to auto: no note
    res = cli("rl", *ARGS, "env.normalize_obs=yes", "run_dir=x")
    assert res.code == 2 and "env.normalize_obs must be true, false or auto" in res.err


def test_default_is_on_for_state_continuous_control_and_off_elsewhere(workdir):
    """The gymnasium plugin recommends it for continuous actions on state observations (Pendulum):
    the default run normalizes, saves the statistics, and `eval` on its checkpoint uses them;
    discrete CartPole and camera images stay unnormalized; a pinned recipe can switch it off."""
    from rlinf_sim_gymnasium.sim import GymnasiumSimulator

    def recommends(**cfg) -> bool:
        return GymnasiumSimulator(cfg).normalize_default

    assert recommends(env_id="Pendulum-v1") and recommends(env_id="Hopper-v5")
    assert not recommends(env_id="CartPole-v1")
    assert not recommends(env_id="InvertedPendulum-v5", obs="state_rgb", image_size=16)
    base = [a for a in ARGS if not a.startswith("env.normalize")]
    res = _run("rl", *base, "total_steps=64", "run_dir=on")
    assert "=auto -> on: the simulator recommends it" in res.stderr
    final = workdir / "on/checkpoints/final"
    assert load_stats(final)["state.count"][0] > 64  # updated by the run's observations
    ev = _run("eval", "sim=gymnasium", "sim.env_id=Pendulum-v1", f"checkpoint={final}", "episodes=3",
              "tracking.enabled=false", "progress=false", "run_dir=e")
    evaluated = json.loads((workdir / "e/result.json").read_text())["eval"]["return_mean"]
    trained = json.loads((workdir / "on/result.json").read_text())["eval"]["return_mean"]
    assert evaluated == pytest.approx(trained, rel=1e-6), ev.stderr  # as above
    _run("rl", "sim=gymnasium", "sim.env_id=CartPole-v1", "num_envs=2", "algo.rollout_steps=16", "total_steps=64",
         "tracking.enabled=false", "progress=false", "eval.episodes=1", "run_dir=cp")
    assert not (workdir / "cp/checkpoints/final" / FILE).exists()


def load_stats(directory: Path) -> dict:
    from safetensors.numpy import load_file

    return load_file(str(Path(directory) / FILE))
