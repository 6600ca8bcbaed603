"""A stand-in for LIBERO with the API shape rlinf-sim-libero uses (``libero.libero.benchmark``,
``get_libero_path``, ``ControlEnv``), so the plugin's mapping logic is tested without the ~1 GB
install. tests/sims/test_libero.py checks these shapes against the real package so they cannot drift.

The fake keeps the two pieces of hidden state that made real LIBERO episodes depend on the past:
fixtures placed from numpy's global RNG at every reset, and a gripper that integrates its commands.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any, NamedTuple

import numpy as np

N_STATES = 50
STATE_DIM = 12  # the real ones are MuJoCo's flattened (time, qpos, qvel): 70-130 numbers
PROPRIO_KEYS = {"robot0_eef_pos": 3, "robot0_eef_quat": 4, "robot0_gripper_qpos": 2}


class Task(NamedTuple):  # libero.libero.benchmark.Task's fields
    name: str
    language: str
    problem: str
    problem_folder: str
    bddl_file: str
    init_states_file: str


def _suite_class(folder: str, n_tasks: int, prefix: str = "") -> type:
    class Suite:
        def __init__(self, task_order_index: int = 0):
            self.n_tasks = n_tasks

        def get_task(self, i: int) -> Task:
            words = f"do thing {i} of {folder}"
            name = prefix + words.replace(" ", "_")
            return Task(name, words, "Libero", folder, f"{name}.bddl", f"{name}.pruned_init")

        def get_task_init_states(self, i: int) -> np.ndarray:
            rng = np.random.default_rng([i, len(folder)])
            return rng.normal(size=(N_STATES, STATE_DIM))

    return Suite


class FakeControlEnv:
    """``ControlEnv``'s surface: reset, set_init_state -> obs, step -> 4-tuple, check_success, robots, close."""

    made: list["FakeControlEnv"] = []

    def __init__(self, **kwargs: Any):
        self.kwargs = kwargs
        self.robots = [SimpleNamespace(gripper=SimpleNamespace(current_action=np.zeros(2)))]
        self.x = np.zeros(STATE_DIM)
        self.fixture = 0.0
        self.actions: list[np.ndarray] = []
        self.closed = False
        FakeControlEnv.made.append(self)

    def reset(self) -> dict[str, np.ndarray]:
        self.fixture = float(np.random.uniform(-0.02, 0.02))  # what LIBERO's fixture samplers do
        return self._obs()

    def set_init_state(self, state: np.ndarray) -> dict[str, np.ndarray]:
        self.x = np.array(state, dtype=np.float64)
        return self._obs()

    def step(self, action: np.ndarray) -> tuple[dict[str, np.ndarray], float, bool, dict]:
        self.actions.append(np.array(action))
        g = self.robots[0].gripper
        g.current_action = np.clip(g.current_action + 0.2 * np.sign(action[-1]), -1, 1)
        self.x[:6] += 0.05 * np.asarray(action[:6]) + self.fixture
        self.x[6:8] = g.current_action
        return self._obs(), float(self.check_success()), False, {}

    def check_success(self) -> bool:
        return bool(self.x[0] > 1.5)

    def _obs(self) -> dict[str, np.ndarray]:
        out, i = {}, 0
        for key, n in PROPRIO_KEYS.items():
            out[key] = self.x[i:i + n].copy()
            i += n
        out["object-state"] = self.x.copy()
        return out

    def close(self) -> None:
        self.closed = True


class FakeRenderer:
    """``backend.make_renderer``'s product: frames that depend on the env's state and the camera."""

    def __init__(self, raw: FakeControlEnv, size: int):
        self.raw, self.size, self.closed = raw, size, False

    def render(self, camera: str) -> np.ndarray:
        level = int(abs(self.raw.x[:6].sum()) * 40 + (7 if camera == "agentview" else 90)) % 256
        return np.full((self.size, self.size, 3), level, dtype=np.uint8)

    def close(self) -> None:
        self.closed = True


def api(root: Path) -> SimpleNamespace:
    """What ``rlinf_sim_libero.backend.load_api`` returns, over task files created under ``root``."""
    suites = {"libero_spatial": _suite_class("libero_spatial", 10), "libero_object": _suite_class("libero_object", 10),
              "libero_goal": _suite_class("libero_goal", 10), "libero_10": _suite_class("libero_10", 10, "LIVING_ROOM_"),
              "libero_90": _suite_class("libero_90", 90, "KITCHEN_SCENE1_")}
    for name, cls in suites.items():
        suite = cls()
        folder = root / "bddl_files" / name
        folder.mkdir(parents=True, exist_ok=True)
        for i in range(suite.n_tasks):
            (folder / suite.get_task(i).bddl_file).write_text("(define (problem fake))\n")
    benchmark = SimpleNamespace(get_benchmark_dict=lambda: dict(suites), Task=Task)
    paths = {"bddl_files": str(root / "bddl_files"), "init_states": str(root / "init_files")}
    return SimpleNamespace(benchmark=benchmark, get_libero_path=lambda key: paths[key], ControlEnv=FakeControlEnv)
