"""Meta-World v3 behind rlinf's simulator contract.

- One task (``task: push-v3``), a list (``tasks: [...]``) or a benchmark set (``benchmark: MT10``).
- ``reset(seed=s)`` makes the episode a function of ``s`` alone: for several tasks the task is
  ``tasks[s % len(tasks)]`` (consecutive evaluation seeds cycle through the tasks), and the
  object/goal positions are drawn from a generator seeded with ``s``. A GRPO group (G envs
  reset with one seed) therefore shares its task and initial state. Unlike Meta-World's MT1
  (50 fixed goal sets), positions are continuous, so evaluation seeds are really held out.
- Observations: ``state`` (39-d: hand, gripper, objects, previous frame, goal), ``task_id``
  (int, index into ``EnvSpec.tasks``), and with pixels ``rgb`` ([H, W, 3] uint8) plus
  ``proprio`` (hand position and gripper opening, now and one step before; 8-d).
- Reward ``sparse`` (default): 1 at each step where the task is solved (with
  ``terminate_on_success``, its default, that is the last step: the return is the success).
  ``shaped``: Meta-World's dense reward (0-10 per step), by default without ending at success,
  which would make success cost the rest of the episode's reward.
"""

from __future__ import annotations

import difflib
import os
import warnings
from dataclasses import dataclass
from typing import Any, Callable, Mapping

import numpy as np

from rlinf_cli.api import settings, ArraySpec, EnvSpec, Obs, UserError
from rlinf_sim_metaworld import tasks as task_sets

OBS_MODES = ("state", "rgb", "state_rgb")
STATE_DIM = 39
PROPRIO_INDEX = [0, 1, 2, 3, 18, 19, 20, 21]
VIDEO_KEY = "video"  # camera frames rendered only for evaluation videos (video_size > 0)  # hand xyz + gripper opening, this step and the previous one


@dataclass(frozen=True)
class MetaWorldConfig:
    task: str = "reach-v3"  # one Meta-World v3 task (used when tasks and benchmark are empty)
    tasks: tuple[str, ...] = ()  # several tasks for one multi-task policy; task = tasks[seed % len]
    benchmark: str | None = None  # MT10 | MT50: Meta-World's task sets (overrides task/tasks)
    max_episode_steps: int = 200  # steps before truncation (Meta-World's own limit is 500)
    # end the episode at the first successful step; null = with the sparse reward only: under the
    # shaped one (up to 10 per step) ending early forfeits the rest, so RL learns to avoid success
    terminate_on_success: bool | None = None
    reward: str = "sparse"  # sparse: 1 when solved, else 0 | shaped: Meta-World's dense reward
    reward_scale: float = 1.0  # rewards are multiplied by this
    obs: str = "state"  # state | rgb (pixels + proprioception) | state_rgb (both)
    image_size: int = 84  # rgb height and width in pixels
    camera: str = "corner"  # corner, corner2, corner3, corner4, topview, behindGripper, gripperPOV
    instruction: bool = True  # observation 'instruction': the task's language instruction (a text entry)
    instructions: tuple[str, ...] = ()  # instruction texts per task, in task order; () = the built-in ones
    video_size: int = 0  # > 0: also render the camera at this size under the key "video" (evaluation videos)

    def __post_init__(self) -> None:
        if self.reward not in ("sparse", "shaped"):
            raise ValueError(f"reward must be 'sparse' or 'shaped', got {self.reward!r}")
        if self.obs not in OBS_MODES:
            raise ValueError(f"obs must be one of {', '.join(OBS_MODES)}, got {self.obs!r}")
        if self.benchmark is not None and self.benchmark not in ("MT10", "MT50"):
            raise ValueError(f"benchmark must be MT10, MT50 or null, got {self.benchmark!r}")
        if self.max_episode_steps < 1 or self.image_size < 8:
            raise ValueError("max_episode_steps must be >= 1 and image_size >= 8")
        if self.terminate_on_success is None:
            object.__setattr__(self, "terminate_on_success", self.reward == "sparse")

    @property
    def rgb(self) -> bool:
        return self.obs != "state"


# -- a per-process pool of Meta-World envs ----------------------------------------------------
# Building one env compiles its MuJoCo model (~0.15 s; through Meta-World's MT1 benchmark,
# which pre-samples 50 goals, ~0.8 s). Stages build vector envs repeatedly (training, then
# evaluation), so closed envs go back to a pool and are reused. Entries remember their process:
# a forked worker must not reuse its parent's renderer (GL contexts do not survive a fork).
_POOL: dict[str, list[Any]] = {}
_POOL_MAX = 32  # envs kept per task


def _take(task: str) -> Any:
    entries = _POOL.get(task, [])
    while entries:
        env = entries.pop()
        if getattr(env, "_rlinf_pid", None) == os.getpid():
            return env
    return _create(task)


def _give_back(task: str, env: Any) -> None:
    entries = _POOL.setdefault(task, [])
    if len(entries) < _POOL_MAX and getattr(env, "_rlinf_pid", None) == os.getpid():
        entries.append(env)
        return
    for r in getattr(env, "_rlinf_renderers", {}).values():
        r.close()
    env.close()


def _create(task: str) -> Any:
    from metaworld.env_dict import ALL_V3_ENVIRONMENTS

    env = ALL_V3_ENVIRONMENTS[task]()
    # What Meta-World's MT benchmarks do, minus the fixed goal list: goal in the observation,
    # positions drawn at every reset from env.np_random (which reset() seeds).
    env._partially_observable = False
    del env.sawyer_observation_space  # a cached property that depends on the line above
    env._freeze_rand_vec = False
    env.seeded_rand_vec = True
    env._set_task_called = True
    env._rlinf_pid = os.getpid()
    env._rlinf_renderers = {}
    from rlinf_sim_metaworld import fast

    fast.install(env)  # exact vectorised versions of two slow Meta-World helpers (~1.7x faster steps)
    return env


class MetaWorldEnv:
    """One env slot: holds one Meta-World env per task it has been reset into."""

    def __init__(self, cfg: MetaWorldConfig, task_names: tuple[str, ...], index: int):
        self.cfg = cfg
        self.tasks = task_names
        self.instructions = _instructions(cfg, task_names)
        self._envs: dict[int, Any] = {}
        # Unseeded resets (auto-reset) continue a stream that the last seeded reset restarted.
        self._stream = np.random.default_rng([index, 0x3E7A])
        self._env: Any = None
        self._task = 0
        self._steps = 0
        self._state: np.ndarray | None = None

    def _raw(self, task_id: int) -> Any:
        env = self._envs.get(task_id)
        if env is None:
            env = self._envs[task_id] = _take(self.tasks[task_id])
            env.max_path_length = self.cfg.max_episode_steps  # we truncate; Meta-World must not raise first
        return env

    def reset(self, *, seed: int | None = None) -> tuple[Obs, dict]:
        from gymnasium.utils import seeding

        if seed is None:
            seed = int(self._stream.integers(2**31 - 1))
        else:
            self._stream = np.random.default_rng([int(seed), 0x5EED])
        self._task = int(seed) % len(self.tasks)
        self._env = self._raw(self._task)
        self._env.np_random, _ = seeding.np_random(int(seed))
        self._state, _ = self._env.reset()
        self._steps = 0
        return self._obs(self._state), {"task": self.tasks[self._task], "seed": int(seed)}

    def step(self, action: np.ndarray) -> tuple[Obs, float, bool, bool, dict]:
        reward, terminated, truncated, info = self.step_unobserved(action)
        return self.observe(), reward, terminated, truncated, info

    def step_unobserved(self, action: np.ndarray) -> tuple[float, bool, bool, dict]:
        """``step`` without building the observation (no camera render): action chunks call
        this for every inner step but the last (rlinf_cli/runtime/chunking.py)."""
        a = np.clip(np.asarray(action, dtype=np.float64).reshape(4), -1.0, 1.0)
        self._state, shaped, _, _, info = self._env.step(a)
        self._steps += 1
        success = bool(info.get("success", False))
        reward = float(success) if self.cfg.reward == "sparse" else float(shaped)
        terminated = success and self.cfg.terminate_on_success
        truncated = not terminated and self._steps >= self.cfg.max_episode_steps
        info = {"success": success, "task": self.tasks[self._task]}
        return reward * self.cfg.reward_scale, terminated, truncated, info

    def observe(self) -> Obs:
        """The observation of the current state (what the last ``step`` or ``reset`` returned)."""
        return self._obs(self._state)

    def _obs(self, state: np.ndarray) -> Obs:
        obs: Obs = {"task_id": np.asarray(self._task, dtype=np.int64)}
        if self.cfg.instruction:
            obs["instruction"] = self.instructions[self._task]
        if self.cfg.obs != "rgb":
            obs["state"] = np.asarray(state, dtype=np.float32)
        if self.cfg.rgb:
            obs["rgb"] = self._renderer(self.cfg.image_size).render(self._env.data)
            obs["proprio"] = np.asarray(state[PROPRIO_INDEX], dtype=np.float32)
        if self.cfg.video_size:
            obs[VIDEO_KEY] = self._renderer(self.cfg.video_size).render(self._env.data)
        return obs

    def _renderer(self, size: int) -> Any:
        key = (self.cfg.camera, size)
        renderer = self._env._rlinf_renderers.get(key)
        if renderer is None:
            from rlinf_sim_metaworld.render import FastRenderer

            renderer = FastRenderer(self._env.model, self.cfg.camera, size, size)
            self._env._rlinf_renderers[key] = renderer
        return renderer

    def close(self) -> None:
        for task_id, env in self._envs.items():
            _give_back(self.tasks[task_id], env)
        self._envs.clear()
        self._env = None


class ScriptedExpert:
    """Meta-World's hand-written policies (``metaworld.policies``), one per task; reads ``state``."""

    def __init__(self, task_names: tuple[str, ...]):
        self.tasks = task_names
        self._policies: dict[int, Any] = {}

    def __call__(self, obs: Obs, index: int) -> np.ndarray:
        task_id = int(obs["task_id"])
        policy = self._policies.get(task_id)
        if policy is None:
            from metaworld.policies import ENV_POLICY_MAP

            # The policies warn at every step where their gains saturate; the env clips anyway.
            warnings.filterwarnings("ignore", message="Constant\\(s\\) may be too high")
            policy = self._policies[task_id] = ENV_POLICY_MAP[self.tasks[task_id]]()
        action = policy.get_action(np.asarray(obs["state"], dtype=np.float64))
        return np.clip(action, -1.0, 1.0).astype(np.float32)


class MetaWorldSimulator:
    fps = 80  # control steps per second: 5 MuJoCo steps of 2.5 ms each (env.dt = 0.0125); datasets and videos use it

    def __init__(self, cfg: Mapping[str, Any]):
        self.cfg = settings.build(MetaWorldConfig, cfg, "sim")
        if self.cfg.rgb or self.cfg.video_size:
            from rlinf_mujoco_gl import prepare_mujoco_gl

            prepare_mujoco_gl()  # before anything imports mujoco
        self.tasks = _resolve_tasks(self.cfg)
        self.instructions = _instructions(self.cfg, self.tasks)
        # for titles and tables
        self.label = f"metaworld/{self.tasks[0] if len(self.tasks) == 1 else self.cfg.benchmark or f'{len(self.tasks)} tasks'}"
        self.spec = self._spec()

    def _spec(self) -> EnvSpec:
        c = self.cfg
        obs: dict[str, ArraySpec] = {}
        if c.obs != "rgb":
            obs["state"] = ArraySpec((STATE_DIM,), "float32")
        if c.rgb:
            obs["rgb"] = ArraySpec((c.image_size, c.image_size, 3), "uint8", 0, 255)
            obs["proprio"] = ArraySpec((len(PROPRIO_INDEX),), "float32")
        if c.video_size:
            obs[VIDEO_KEY] = ArraySpec((c.video_size, c.video_size, 3), "uint8", 0, 255)
        obs["task_id"] = ArraySpec((), "int64", 0, len(self.tasks) - 1)
        if c.instruction:
            obs["instruction"] = ArraySpec((), "str")
        return EnvSpec(obs, ArraySpec((4,), "float32", -1.0, 1.0), max_episode_steps=c.max_episode_steps,
                       tasks=self.tasks, has_success=True)

    def with_video(self, size: int) -> tuple["MetaWorldSimulator", str]:
        """This simulator with the camera also rendered at ``size`` under ``"video"`` (what
        ``rlinf eval ... video=N`` records); everything else, physics included, is unchanged."""
        from dataclasses import asdict

        return MetaWorldSimulator({**asdict(self.cfg), "video_size": int(size)}), VIDEO_KEY

    def make_env(self, index: int) -> MetaWorldEnv:
        if self.cfg.rgb or self.cfg.video_size:
            from rlinf_mujoco_gl import prepare_mujoco_gl

            prepare_mujoco_gl()  # this may be a fresh worker process
        return MetaWorldEnv(self.cfg, self.tasks, index)

    def expert(self) -> Callable[[Obs, int], np.ndarray] | None:
        if "state" not in self.spec.observation:
            raise UserError("the scripted experts read the state: collect with sim.obs=state_rgb "
                            "(a pixel policy can still leave it out: model.obs_keys=[rgb,proprio])")
        return ScriptedExpert(self.tasks)


def _instructions(cfg: MetaWorldConfig, tasks: tuple[str, ...]) -> tuple[str, ...]:
    """Each task's instruction: ``sim.instructions`` (other phrasings, or instructions swapped
    between tasks to test whether a policy reads them) or the built-in texts."""
    if not cfg.instructions:
        return tuple(task_sets.instruction(t) for t in tasks)
    if len(cfg.instructions) != len(tasks):
        raise UserError(f"sim.instructions has {len(cfg.instructions)} texts for {len(tasks)} tasks {list(tasks)}: "
                        "give one per task, in task order")
    return tuple(str(t) for t in cfg.instructions)


def _resolve_tasks(cfg: MetaWorldConfig) -> tuple[str, ...]:
    known = task_sets.all_tasks()
    if cfg.benchmark is not None:
        return task_sets.benchmark_tasks(cfg.benchmark)
    names = tuple(cfg.tasks) if cfg.tasks else (cfg.task,)
    for name in names:
        if name not in known:
            close = difflib.get_close_matches(name, known, n=1)
            hint = f" Did you mean '{close[0]}'?" if close else f" Tasks: {', '.join(known[:6])}, ... (50 in all)"
            raise UserError(f"unknown Meta-World task '{name}'.{hint}")
    if len(set(names)) != len(names):
        raise UserError(f"sim.tasks lists a task twice: {list(names)}")
    return names
