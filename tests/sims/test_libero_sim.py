"""rlinf-sim-libero's own logic on a fake LIBERO (tests/fake_libero.py): seeds -> fixed initial
states, task selection, observations, success, resets that forget the previous episode, errors.

These run in `make test` without LIBERO; tests/sims/test_libero.py (marker `libero`) runs the real one.
"""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

import fake_libero
from rlinf_cli.checks import check_simulator
from rlinf_cli.errors import UserError
from rlinf_sim_libero import backend, suites
from rlinf_sim_libero.sim import SETTLE_ACTION, LiberoSimulator


@pytest.fixture
def fake(tmp_path, monkeypatch):
    fake_libero.FakeControlEnv.made.clear()
    api = fake_libero.api(tmp_path)
    monkeypatch.setattr(backend, "load_api", lambda: api)
    monkeypatch.setattr(backend, "make_renderer", fake_libero.FakeRenderer)
    return api


def make(**cfg) -> LiberoSimulator:
    return LiberoSimulator({"name": "libero", **cfg})


# -- seeds -> (task, initial state) ----------------------------------------------------------------
def test_eval_seeds_visit_every_task_and_state_once():
    pairs = [suites.seed_to_state(suites.EVAL_SEED_START + i, 10, 50) for i in range(500)]
    assert len(set(pairs)) == 500
    assert pairs[:3] == [(0, 0), (1, 0), (2, 0)] and pairs[10] == (0, 1) and pairs[499] == (9, 49)


def test_held_out_states_are_never_trained_on():
    train = {suites.seed_to_state(s, 3, 50, held_out=10)[1] for s in range(0, 1_000_000, 997)}
    held = {suites.seed_to_state(suites.EVAL_SEED_START + i, 3, 50, held_out=10)[1] for i in range(300)}
    assert train == set(range(40)) and held == set(range(40, 50))
    # without held_out, evaluation uses the states training also uses
    assert {suites.seed_to_state(suites.EVAL_SEED_START + i, 3, 50)[1] for i in range(150)} == set(range(50))


def test_seed_mapping_rejects_bad_input():
    for bad in (dict(n_tasks=0, n_states=50), dict(n_tasks=3, n_states=50, held_out=50), dict(n_tasks=3, n_states=50, held_out=-1)):
        with pytest.raises(ValueError):
            suites.seed_to_state(5, **bad)
    with pytest.raises(ValueError):
        suites.seed_to_state(-1, 3, 50)


def test_suite_names():
    assert [suites.benchmark_name(s) for s in ("spatial", "object", "goal", 10, "90", "libero_goal", "spatial_lan")] == [
        "libero_spatial", "libero_object", "libero_goal", "libero_10", "libero_90", "libero_goal", "libero_spatial_lan"]


# -- the simulator on the fake ---------------------------------------------------------------------
def test_spec_tasks_and_instructions(fake):
    sim = make(suite=10, image_size=32)
    spec = sim.spec
    assert list(spec.observation) == ["rgb", "wrist_rgb", "proprio", "task_id", "instruction"]
    assert spec.observation["rgb"].shape == (32, 32, 3) and spec.observation["rgb"].dtype == "uint8"
    assert spec.observation["proprio"].shape == (9,) and spec.observation["instruction"].is_text
    assert spec.action.shape == (7,) and (spec.action.low, spec.action.high) == (-1.0, 1.0)
    assert spec.max_episode_steps == 520 and spec.has_success and len(spec.tasks) == 10
    assert spec.tasks[3] == "LIVING_ROOM_do_thing_3_of_libero_10" and sim.instructions[3] == "do thing 3 of libero_10"
    assert make(suite="spatial", wrist=False, instruction=False).spec.observation.keys() == {"rgb", "proprio", "task_id"}
    assert make(suite="90").spec.max_episode_steps == 400 and len(make(suite="90").spec.tasks) == 90
    assert make(suite="goal", max_episode_steps=50).spec.max_episode_steps == 50


def test_tasks_by_index_and_name(fake):
    sim = make(suite="object", tasks=[4, "do_thing_1_of_libero_object"])
    assert sim.spec.tasks == ("do_thing_4_of_libero_object", "do_thing_1_of_libero_object")
    assert [t.index for t in sim.tasks] == [4, 1] and sim.label == "libero/object"
    assert make(suite="object", tasks=[2]).label == "libero/object/do_thing_2_of_libero_object"


@pytest.mark.parametrize("cfg,words", [
    (dict(suite="spacial"), "Did you mean 'spatial'"),
    (dict(suite="spatial", tasks=[10]), "tasks 0..9"),
    (dict(suite="spatial", tasks=["do_thing_1_of_libero_spatil"]), "Did you mean 'do_thing_1_of_libero_spatial'"),
    (dict(suite="spatial", tasks=[1, 1]), "twice"),
    (dict(suite="spatial", held_out=50), "hold out fewer"),
    (dict(suite="spatial", image_size=4), "image_size"),
    (dict(suite="spatial", cameras=2), "not an option"),
])
def test_bad_config_is_one_clear_line(fake, cfg, words):
    with pytest.raises(UserError) as err:
        make(**cfg)
    assert words in str(err.value) and "\n" not in str(err.value)


def test_reset_maps_the_seed_settles_and_observes(fake):
    sim = make(suite="spatial", tasks=[2, 5, 7], settle_steps=4, image_size=16)
    env = sim.make_env(0)
    seed = suites.EVAL_SEED_START + 3 * 6 + 1  # task 5 (second selected), initial state 6
    obs, info = env.reset(seed=seed)
    assert info["task"] == "do_thing_5_of_libero_spatial" and info["init_state"] == 6
    raw = fake_libero.FakeControlEnv.made[-1]
    assert raw.kwargs["bddl_file_name"].endswith("libero_spatial/do_thing_5_of_libero_spatial.bddl")
    assert raw.kwargs["hard_reset"] is False and raw.kwargs["use_camera_obs"] is False
    assert len(raw.actions) == 4 and all(np.array_equal(a, SETTLE_ACTION) for a in raw.actions)
    assert int(obs["task_id"]) == 1 and obs["instruction"] == "do thing 5 of libero_spatial"
    x = raw.x
    np.testing.assert_array_equal(obs["proprio"], x[:9].astype(np.float32))
    assert obs["rgb"].shape == (16, 16, 3) and obs["rgb"][0, 0, 0] != obs["wrist_rgb"][0, 0, 0]
    # the stored state was the starting point (settling moved only the gripper and the fixture offset)
    state = fake_libero._suite_class("libero_spatial", 10)().get_task_init_states(5)[6]
    np.testing.assert_allclose(x[8:], state[8:])


def test_same_seed_same_episode_whatever_came_before(fake):
    """The fake's fixture RNG and integrating gripper carry over between episodes unless the
    plugin resets them (as real LIBERO did before backend.reset_raw)."""
    sim = make(suite="spatial", tasks=[0], image_size=8, settle_steps=2)  # too few steps to saturate the gripper
    env = sim.make_env(0)
    first, _ = env.reset(seed=11)
    rng = np.random.default_rng(0)
    for _ in range(5):
        env.step(np.concatenate([rng.uniform(-1, 1, 6), [1.0]]))
    np.random.seed(123)
    state = np.random.get_state()[1].copy()
    again, _ = env.reset(seed=11)
    for k in first:
        np.testing.assert_array_equal(np.asarray(first[k]), np.asarray(again[k]), err_msg=k)
    np.testing.assert_array_equal(np.random.get_state()[1], state)  # the caller's global RNG is untouched
    rows = check_simulator(sim)
    assert all(ok for _, ok, _ in rows) and len(rows) == 8, rows


def test_success_terminates_with_reward_and_truncation(fake):
    sim = make(suite="spatial", tasks=[0], max_episode_steps=40, settle_steps=0, reward_scale=2.0, image_size=8)
    env = sim.make_env(0)
    env.reset(seed=0)
    push = np.array([1, 0, 0, 0, 0, 0, -1], dtype=np.float32)
    for t in range(40):
        _, r, term, trunc, info = env.step(push)
        if info["success"]:
            break
    assert info["success"] and term and not trunc and r == 2.0 and t < 39
    env.reset(seed=0)
    for t in range(40):
        _, r, term, trunc, info = env.step(-push)
    assert trunc and not term and r == 0.0 and not info["success"]
    keep = make(suite="spatial", tasks=[0], settle_steps=0, terminate_on_success=False, image_size=8).make_env(0)
    keep.reset(seed=0)
    for _ in range(40):
        _, r, term, _, info = keep.step(push)
        assert not term
    assert info["success"] and r == 1.0


def test_task_switches_close_envs_beyond_the_cache(fake):
    sim = make(suite="goal", tasks=[0, 1, 2], image_size=8, settle_steps=0)
    env = sim.make_env(0)
    for s in range(3):
        env.reset(seed=s)
    made = fake_libero.FakeControlEnv.made
    assert len(made) == 3 and [m.closed for m in made] == [True, True, False]
    cached = make(suite="goal", tasks=[0, 1, 2], image_size=8, settle_steps=0, env_cache=3).make_env(0)
    for s in (0, 1, 2, 3, 4, 5):
        cached.reset(seed=s)
    assert len(made) == 6 and not any(m.closed for m in made[3:])
    cached.close()
    assert all(m.closed for m in made[3:])


def test_unseeded_resets_continue_a_stream(fake):
    sim = make(suite="spatial", image_size=8, settle_steps=0)
    a, b = sim.make_env(0), sim.make_env(0)
    a.reset(seed=3)
    b.reset(seed=3)
    assert [a.reset()[1]["seed"] for _ in range(3)] == [b.reset()[1]["seed"] for _ in range(3)]
    assert all(0 <= a.reset()[1]["seed"] < suites.EVAL_SEED_START for _ in range(5))


def test_eval_table_reports_each_tasks_instruction(fake, cli, monkeypatch):
    res = cli("eval", "sim=libero", "sim.suite=spatial", "sim.tasks=[0,3]", "sim.image_size=8", "checkpoint=random",
              "episodes=4", "num_envs=2", "sim.max_episode_steps=5", "tracking.enabled=false", "progress=false")
    assert res.code == 0, res.err
    for task in (0, 3):  # the instruction under the table, beside its task's row label
        assert f"random · do_thing_{task}_of_libero_spatial: do thing {task} of libero_spatial" in res.out, res.out
    per_task = res.json_tail()["per_task"]
    assert set(per_task) == {"do_thing_0_of_libero_spatial", "do_thing_3_of_libero_spatial"}


# -- without LIBERO ----------------------------------------------------------------------------------
def test_registering_imports_nothing_heavy():
    code = ("import sys; from rlinf_cli.registry import get_registry; get_registry().get('simulator', 'libero'); "
            "bad = [m for m in ('libero', 'robosuite', 'mujoco', 'torch') if m in sys.modules]; print(bad); assert not bad")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert res.returncode == 0, res.stdout + res.stderr


def test_missing_libero_says_what_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "libero", None)  # import libero -> ImportError, as where it is not installed
    monkeypatch.setitem(sys.modules, "libero.libero", None)
    with pytest.raises(UserError) as err:
        make(suite="spatial")
    assert "make libero" in str(err.value) and "rlinf-sim-libero[libero]" in str(err.value)
