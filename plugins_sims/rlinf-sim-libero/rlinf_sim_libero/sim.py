"""LIBERO behind rlinf's simulator contract.

- ``suite: spatial | object | goal | 10 | 90`` (or any suite name LIBERO registers, such as the
  LIBERO-PRO ``spatial_lan``); ``tasks: [0, 3]`` or task names pick tasks of the suite (default all).
- ``reset(seed=s)`` starts task ``tasks[k % T]`` from one of the suite's fixed initial states
  (rlinf_sim_libero/suites.py: ``seed_to_state``), then lets the scene settle for ``settle_steps``
  steps with the arm still and the gripper open, as LIBERO evaluations commonly do. A GRPO group
  (one seed) shares its task and initial state.
- Observations: ``rgb`` (agent-view camera) and ``wrist_rgb`` (eye-in-hand camera), ``[S, S, 3]``
  uint8; ``proprio`` (end-effector position and quaternion, gripper finger positions; 9-d);
  ``task_id``; ``instruction`` (the task's language instruction, a text entry).
- Actions: 7-d in [-1, 1], robosuite's OSC_POSE controller (position and rotation deltas) plus the
  gripper (-1 open, 1 close). Reward 1 at a step where the task is solved (LIBERO's own success
  check); ``terminate_on_success`` ends the episode there.
"""

from __future__ import annotations

import difflib
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Callable, Mapping

import numpy as np

from rlinf_cli.api import settings, ArraySpec, EnvSpec, Obs, UserError
from rlinf_sim_libero import backend, suites

ACTION_DIM = 7
SETTLE_ACTION = np.array([0, 0, 0, 0, 0, 0, -1], dtype=np.float64)  # arm still, gripper open
PROPRIO_DIM = sum(n for _, n in backend.PROPRIO)


@dataclass(frozen=True)
class LiberoConfig:
    suite: str | int = "spatial"  # spatial | object | goal | 10 | 90 (or another LIBERO suite name)
    tasks: tuple[int | str, ...] = ()  # task indices or names within the suite; () = all, in LIBERO's order
    max_episode_steps: int = 0  # 0 = the suite's usual limit (220 spatial, 280 object, 300 goal, 520 10, 400 90)
    settle_steps: int = 10  # still steps after setting the initial state (not counted, not seen)
    held_out: int = 0  # initial states reserved for evaluation seeds (>= 1,000,000); 0 = all states serve both
    image_size: int = 128  # camera images are image_size x image_size
    wrist: bool = True  # also render the eye-in-hand camera (wrist_rgb); false halves rendering time
    instruction: bool = True  # observation 'instruction': the task's language instruction (a text entry)
    terminate_on_success: bool = True  # end the episode at the first successful step
    reward_scale: float = 1.0  # the success reward (1) is multiplied by this
    env_cache: int = 1  # LIBERO envs one env slot keeps (one per task; building one takes seconds)

    def __post_init__(self) -> None:
        if self.max_episode_steps < 0 or self.settle_steps < 0 or self.held_out < 0:
            raise ValueError("max_episode_steps, settle_steps and held_out must be >= 0")
        if self.image_size < 8 or self.env_cache < 1:
            raise ValueError("image_size must be >= 8 and env_cache >= 1")


@dataclass(frozen=True)
class TaskInfo:
    index: int  # position in the suite (LIBERO's task id)
    name: str
    instruction: str
    bddl_file: str
    n_states: int  # fixed initial states stored for the task


class LiberoEnv:
    """One env slot: a LIBERO env for the task of its current episode (others cached or closed)."""

    def __init__(self, cfg: LiberoConfig, suite: str, tasks: tuple[TaskInfo, ...], max_steps: int, index: int):
        self.cfg, self.suite, self.tasks, self.max_steps = cfg, suite, tasks, max_steps
        self._api: Any = None
        self._envs: OrderedDict[int, tuple[Any, Any]] = OrderedDict()  # task -> (LIBERO env, renderer)
        self._states: dict[int, np.ndarray] = {}
        # Unseeded resets (auto-reset) continue a stream that the last seeded reset restarted.
        self._stream = np.random.default_rng([index, 0x11BE])
        self._task = 0
        self._raw: Any = None
        self._renderer: Any = None
        self._steps = 0

    def _slot(self, task: int) -> tuple[Any, Any]:
        if task in self._envs:
            self._envs.move_to_end(task)
            return self._envs[task]
        if self._api is None:
            self._api = backend.load_api()
        while len(self._envs) >= self.cfg.env_cache:
            _, (raw, renderer) = self._envs.popitem(last=False)
            renderer.close()
            raw.close()
        raw = backend.make_raw_env(self._api, self.tasks[task].bddl_file)
        self._envs[task] = (raw, backend.make_renderer(raw, self.cfg.image_size))
        return self._envs[task]

    def _init_states(self, task: int) -> np.ndarray:
        states = self._states.get(task)
        if states is None:
            if self._api is None:
                self._api = backend.load_api()
            with backend.quiet():
                suite = self._api.benchmark.get_benchmark_dict()[self.suite]()
            states = self._states[task] = np.asarray(suite.get_task_init_states(self.tasks[task].index))
        return states

    def reset(self, *, seed: int | None = None) -> tuple[Obs, dict]:
        if seed is None:
            seed = int(self._stream.integers(suites.EVAL_SEED_START))
        else:
            self._stream = np.random.default_rng([int(seed), 0x5EED])
        # the task depends on the seed alone; the state index on the task's own count of stored states
        self._task, _ = suites.seed_to_state(int(seed), len(self.tasks), 1)
        _, state = suites.seed_to_state(int(seed), len(self.tasks), self.tasks[self._task].n_states, self.cfg.held_out)
        self._raw, self._renderer = self._slot(self._task)
        backend.reset_raw(self._raw, (self.tasks[self._task].index, int(state)))
        raw_obs = self._raw.set_init_state(self._init_states(self._task)[state])
        for _ in range(self.cfg.settle_steps):
            raw_obs, _, _, _ = self._raw.step(SETTLE_ACTION.copy())
        self._steps = 0
        return self._obs(raw_obs), {"task": self.tasks[self._task].name, "init_state": int(state), "seed": int(seed)}

    def step(self, action: np.ndarray) -> tuple[Obs, float, bool, bool, dict]:
        a = np.clip(np.asarray(action, dtype=np.float64).reshape(ACTION_DIM), -1.0, 1.0)
        raw_obs, _, _, _ = self._raw.step(a)
        self._steps += 1
        success = bool(self._raw.check_success())
        terminated = success and self.cfg.terminate_on_success
        truncated = not terminated and self._steps >= self.max_steps
        return (self._obs(raw_obs), float(success) * self.cfg.reward_scale, terminated, truncated,
                {"success": success, "task": self.tasks[self._task].name})

    def _obs(self, raw_obs: Mapping[str, Any]) -> Obs:
        obs: Obs = {"rgb": self._renderer.render(backend.CAMERAS["rgb"])}
        if self.cfg.wrist:
            obs["wrist_rgb"] = self._renderer.render(backend.CAMERAS["wrist_rgb"])
        obs["proprio"] = np.concatenate([np.asarray(raw_obs[k], dtype=np.float32).reshape(n)
                                         for k, n in backend.PROPRIO])
        obs["task_id"] = np.asarray(self._task, dtype=np.int64)
        if self.cfg.instruction:
            obs["instruction"] = self.tasks[self._task].instruction
        return obs

    def close(self) -> None:
        for raw, renderer in self._envs.values():
            renderer.close()
            raw.close()
        self._envs.clear()
        self._raw = self._renderer = None


class LiberoSimulator:
    fps = 20  # LIBERO's control frequency: datasets and videos use it

    def __init__(self, cfg: Mapping[str, Any]):
        self.cfg = settings.build(LiberoConfig, cfg, "sim")
        self.suite = suites.benchmark_name(self.cfg.suite)
        self.tasks = _resolve_tasks(self.cfg, self.suite)
        self.instructions = tuple(t.instruction for t in self.tasks)
        fewest = min(t.n_states for t in self.tasks)
        if self.cfg.held_out >= fewest:
            raise UserError(f"sim.held_out={self.cfg.held_out}: the tasks have {fewest} initial states; "
                            f"hold out fewer (0..{fewest - 1})")
        self.max_steps = self.cfg.max_episode_steps or suites.MAX_STEPS.get(self.suite, suites.DEFAULT_MAX_STEPS)
        short = self.suite.removeprefix("libero_")
        self.label = f"libero/{short}" + (f"/{self.tasks[0].name}" if len(self.tasks) == 1 else "")
        self.spec = self._spec()

    def _spec(self) -> EnvSpec:
        c = self.cfg
        image = ArraySpec((c.image_size, c.image_size, 3), "uint8", 0, 255)
        obs: dict[str, ArraySpec] = {"rgb": image}
        if c.wrist:
            obs["wrist_rgb"] = image
        obs["proprio"] = ArraySpec((PROPRIO_DIM,), "float32")
        obs["task_id"] = ArraySpec((), "int64", 0, len(self.tasks) - 1)
        if c.instruction:
            obs["instruction"] = ArraySpec((), "str")
        return EnvSpec(obs, ArraySpec((ACTION_DIM,), "float32", -1.0, 1.0), max_episode_steps=self.max_steps,
                       tasks=tuple(t.name for t in self.tasks), has_success=True)

    def make_env(self, index: int) -> LiberoEnv:
        return LiberoEnv(self.cfg, self.suite, self.tasks, self.max_steps, index)

    def expert(self) -> Callable[[Obs, int], np.ndarray] | None:
        return None  # LIBERO has no scripted experts; its demonstrations are a separate download (docs/libero.md)


def _resolve_tasks(cfg: LiberoConfig, suite: str) -> tuple[TaskInfo, ...]:
    """The selected tasks of the suite, with what an env needs to build them (paths, state counts)."""
    import os

    api = backend.load_api()
    known = api.benchmark.get_benchmark_dict()
    if suite not in known:
        close = difflib.get_close_matches(suite, list(known), n=1)
        hint = f" Did you mean '{close[0].removeprefix('libero_')}'?" if close else ""
        raise UserError(f"unknown LIBERO suite '{cfg.suite}'.{hint} Suites: {', '.join(suites.SUITES)} "
                        f"(or another of the {len(known)} LIBERO registers, e.g. spatial_lan)")
    with backend.quiet():
        bench = known[suite]()
    names = [bench.get_task(i).name for i in range(bench.n_tasks)]
    picked: list[int] = []
    for t in cfg.tasks or tuple(range(bench.n_tasks)):
        if isinstance(t, int):
            if not 0 <= t < bench.n_tasks:
                raise UserError(f"sim.tasks: task {t} does not exist; suite '{suite}' has tasks 0..{bench.n_tasks - 1}")
            picked.append(t)
        elif t in names:
            picked.append(names.index(t))
        else:
            close = difflib.get_close_matches(str(t), names, n=1)
            hint = f" Did you mean '{close[0]}'?" if close else f" Give an index 0..{bench.n_tasks - 1} or a task name."
            raise UserError(f"sim.tasks: '{t}' is not a task of suite '{suite}'.{hint}")
    if len(set(picked)) != len(picked):
        raise UserError(f"sim.tasks lists a task twice: {list(cfg.tasks)}")
    root = api.get_libero_path("bddl_files")
    out = []
    for i in picked:
        task = bench.get_task(i)
        n_states = int(np.asarray(bench.get_task_init_states(i)).shape[0])
        if n_states < 1:
            raise UserError(f"LIBERO task '{task.name}' of suite '{suite}' has no initial states")
        out.append(TaskInfo(i, str(task.name), str(task.language),
                            os.path.join(root, task.problem_folder, task.bddl_file), n_states))
    return tuple(out)
