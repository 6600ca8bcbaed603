"""ManiSkill3 tasks behind rlinf's simulator contract.

- One task per simulator (``task: PushCube-v1``), each env instance one ManiSkill env on the
  CPU physics backend (``num_envs=1``): rlinf's env workers give the parallelism.
- ``reset(seed=s)`` is ManiSkill's seeded reset: the initial state is a function of ``s`` alone
  (GRPO groups share it); an unseeded reset continues the stream the last seeded one started.
- Observations: ``state`` (ManiSkill's flattened ground-truth state: robot qpos/qvel, tool pose,
  object and goal poses) and/or ``rgb`` (``[H, W, 3]`` uint8 from the task's camera) with
  ``proprio`` (robot qpos, qvel and tool pose; no object state).
- Reward: ManiSkill's ``normalized_dense`` (0-1 per step, 1 when solved) by default; success from
  ManiSkill's ``info["success"]``; ``terminate_on_success`` ends the episode there.
- ``expert()``: scripted experts reading the state for PushCube, PickCube and StackCube with the
  ``pd_ee_delta_pos`` controller. ManiSkill's own motion-planning solutions drive an env object
  directly (mplib plans against the scene), which the ``(obs, index) -> action`` expert contract
  cannot reach; its demonstrations download from a hub, which this package does not do.

ManiSkill 3.0.1 needs numpy<2 and a Vulkan driver, so it usually lives in its own environment and
is reached with ``rlinf env serve`` + ``sim=remote`` (``make maniskill``; docs/remote.md).
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from typing import Any, Callable, Mapping

import numpy as np

from rlinf_cli.api import settings, ArraySpec, EnvSpec, Obs, UserError

OBS_MODES = ("state", "rgb", "state_rgb")
REWARDS = ("normalized_dense", "dense", "sparse")
BACKENDS = ("cpu", "gpu")
# Tasks rlinf checks (tests/sims/test_maniskill.py); any registered ManiSkill task id works.
TASKS = ("PushCube-v1", "PickCube-v1", "StackCube-v1", "PegInsertionSide-v1", "PullCube-v1", "LiftPegUpright-v1",
         "PokeCube-v1", "PlaceSphere-v1", "RollBall-v1", "PushT-v1")


@dataclass(frozen=True)
class ManiSkillConfig:
    task: str = "PushCube-v1"
    obs: str = "state"  # state | rgb | state_rgb
    control_mode: str = "pd_ee_delta_pos"
    reward: str = "normalized_dense"  # normalized_dense | dense | sparse
    reward_scale: float = 1.0
    max_episode_steps: int = 0  # 0 = the task's own limit
    terminate_on_success: bool = True
    image_size: int = 64
    camera: str = "base_camera"
    backend: str = "cpu"  # cpu | gpu

    def __post_init__(self) -> None:
        if self.obs not in OBS_MODES:
            raise ValueError(f"obs must be one of {', '.join(OBS_MODES)}, got {self.obs!r}")
        if self.reward not in REWARDS:
            raise ValueError(f"reward must be one of {', '.join(REWARDS)}, got {self.reward!r}")
        if self.backend not in BACKENDS:
            raise ValueError(f"backend must be cpu or gpu, got {self.backend!r}")
        if self.max_episode_steps < 0 or self.image_size < 8:
            raise ValueError("max_episode_steps must be >= 0 and image_size >= 8")

    @property
    def ms_obs_mode(self) -> str:
        return {"state": "state", "rgb": "rgb", "state_rgb": "rgb+state"}[self.obs]


def _import_maniskill() -> Any:
    try:
        import gymnasium as gym
        import mani_skill.envs  # noqa: F401  (registers the task ids)
    except ImportError as exc:
        raise UserError(f"sim=maniskill needs ManiSkill3 in this environment ({exc}): run `make maniskill` and serve it "
                        "from .venv-maniskill with `rlinf env serve sim=maniskill` (docs/remote.md)") from exc
    return gym


def _to_np(x: Any) -> np.ndarray:
    if hasattr(x, "detach"):
        x = x.detach().cpu().numpy()
    return np.asarray(x)


def _flat(tree: Any) -> np.ndarray:
    """ManiSkill's nested state dict flattened in its own key order (as obs_mode=state does)."""
    parts: list[np.ndarray] = []

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            for v in node.values():
                walk(v)
        else:
            a = _to_np(node).astype(np.float32)
            parts.append(a.reshape(a.shape[0], -1) if a.ndim > 1 else a.reshape(a.shape[0], 1))

    walk(tree)
    return np.concatenate(parts, axis=1)[0]


def _layout(tree: Any, prefix: str = "", start: int = 0) -> tuple[dict[str, tuple[int, int]], int]:
    """Where each leaf of a state dict lands in the flattened state: ``{"extra/obj_pose": (lo, hi)}``."""
    out: dict[str, tuple[int, int]] = {}
    pos = start
    for k, v in tree.items():
        if isinstance(v, dict):
            sub, pos = _layout(v, f"{prefix}{k}/", pos)
            out.update(sub)
        else:
            a = _to_np(v)
            n = int(np.prod(a.shape[1:])) if a.ndim > 1 else 1
            out[f"{prefix}{k}"] = (pos, pos + n)
            pos += n
    return out, pos


def make_raw_env(cfg: ManiSkillConfig) -> Any:
    """One ManiSkill env (``num_envs=1``), unwrapped: rlinf counts steps and handles resets itself."""
    gym = _import_maniskill()
    kwargs: dict[str, Any] = dict(obs_mode=cfg.ms_obs_mode, control_mode=cfg.control_mode, reward_mode=cfg.reward,
                                  num_envs=1, render_mode=None)
    if cfg.backend == "cpu":
        kwargs.update(sim_backend="physx_cpu", render_backend="cpu")
    else:
        kwargs.update(sim_backend="physx_cuda", render_backend="gpu")
    if cfg.obs != "state":
        kwargs["sensor_configs"] = dict(width=cfg.image_size, height=cfg.image_size)
    try:
        env = gym.make(cfg.task, **kwargs)
    except Exception as exc:
        text = f"{type(exc).__name__}: {exc}"
        if "vulkan" in text.lower() or "ErrorIncompatibleDriver" in text:
            raise UserError(f"ManiSkill could not start its renderer ({text.splitlines()[0]}): it needs a Vulkan driver; on "
                            "Debian 12: apt-get install -t bookworm-backports mesa-vulkan-drivers libvulkan1 (docs/remote.md)") from exc
        if "cuda" in text.lower() and cfg.backend == "gpu":
            raise UserError(f"sim.backend=gpu needs an NVIDIA GPU with CUDA here ({text.splitlines()[0]}); use sim.backend=cpu") from exc
        raise UserError(f"ManiSkill could not create {cfg.task} ({text.splitlines()[0]})") from exc
    return env.unwrapped


class ManiSkillEnv:
    """One ManiSkill env as a :class:`~rlinf_cli.api.SingleEnv`."""

    def __init__(self, cfg: ManiSkillConfig, max_steps: int):
        self.cfg = cfg
        self.max_steps = max_steps
        self.env = make_raw_env(cfg)
        self._steps = 0

    def _obs(self, raw: Any) -> Obs:
        obs: Obs = {}
        cfg = self.cfg
        if cfg.obs == "state":
            obs["state"] = _to_np(raw)[0].astype(np.float32)
            return obs
        if cfg.obs == "state_rgb":
            obs["state"] = _to_np(raw["state"])[0].astype(np.float32)
        obs["rgb"] = _to_np(raw["sensor_data"][cfg.camera]["rgb"])[0].astype(np.uint8)
        obs["proprio"] = proprio(self.env)
        return obs

    def reset(self, *, seed: int | None = None) -> tuple[Obs, dict]:
        raw, _ = self.env.reset(seed=None if seed is None else int(seed))
        self._steps = 0
        return self._obs(raw), {}

    def step(self, action: np.ndarray) -> tuple[Obs, float, bool, bool, dict]:
        a = np.clip(np.asarray(action, dtype=np.float32), -1.0, 1.0)
        raw, reward, _, _, info = self.env.step(a)
        self._steps += 1
        success = bool(_to_np(info.get("success", False)).reshape(-1)[0]) if "success" in info else False
        terminated = success and self.cfg.terminate_on_success
        truncated = not terminated and self._steps >= self.max_steps
        r = float(_to_np(reward).reshape(-1)[0]) * self.cfg.reward_scale
        return self._obs(raw), r, terminated, truncated, {"success": success}

    def close(self) -> None:
        self.env.close()


def proprio(env: Any) -> np.ndarray:
    """Robot joint positions and velocities plus the tool pose: what a real robot also knows."""
    parts = [_to_np(v).reshape(-1) for v in env.agent.get_proprioception().values()]
    tcp = getattr(env.agent, "tcp", None)
    if tcp is not None:
        parts.append(_to_np(tcp.pose.raw_pose).reshape(-1))
    return np.concatenate(parts).astype(np.float32)


class ManiSkillSimulator:
    def __init__(self, cfg: Mapping[str, Any]):
        self.cfg = settings.build(ManiSkillConfig, cfg, "sim")
        gym = _import_maniskill()
        if self.cfg.task not in gym.registry:
            known = sorted(k for k in gym.registry if k in TASKS) or list(TASKS)
            close = difflib.get_close_matches(self.cfg.task, list(gym.registry), n=1)
            hint = f" Did you mean '{close[0]}'?" if close else f" Tasks: {', '.join(known)}, ..."
            raise UserError(f"unknown ManiSkill task '{self.cfg.task}'.{hint}")
        self.max_steps = self.cfg.max_episode_steps or int(gym.spec(self.cfg.task).max_episode_steps or 100)
        self.label = f"maniskill/{self.cfg.task}"  # for titles, tables and env-server logs
        self.spec, self.layout = self._probe()

    def _probe(self) -> tuple[EnvSpec, dict[str, tuple[int, int]]]:
        """Build one env to read observation sizes, the action space and the state layout."""
        env = make_raw_env(self.cfg)
        try:
            raw, _ = env.reset(seed=0)
            layout: dict[str, tuple[int, int]] = {}
            if "state" in self.cfg.obs:
                layout, _ = _layout(env._get_obs_state_dict(env.get_info()))
            probe = ManiSkillEnv.__new__(ManiSkillEnv)
            probe.cfg, probe.env = self.cfg, env
            obs = probe._obs(raw)
            space = env.single_action_space
            low, high = float(np.min(space.low)), float(np.max(space.high))
        finally:
            env.close()
        spec_obs = {k: ArraySpec(tuple(v.shape), str(v.dtype), *((0, 255) if k == "rgb" else ())) for k, v in obs.items()}
        spec = EnvSpec(spec_obs, ArraySpec(tuple(space.shape), "float32", low, high), max_episode_steps=self.max_steps,
                       has_success=True)
        return spec, layout

    def make_env(self, index: int) -> ManiSkillEnv:
        return ManiSkillEnv(self.cfg, self.max_steps)

    def expert(self) -> Callable[[Obs, int], np.ndarray] | None:
        from rlinf_sim_maniskill import experts

        make = experts.EXPERTS.get(self.cfg.task)
        if make is None:
            return None
        if "state" not in self.spec.observation:
            raise UserError("the scripted ManiSkill experts read the state: collect with sim.obs=state_rgb "
                            "(a pixel policy can still leave it out: model.obs_keys=[rgb,proprio])")
        if self.cfg.control_mode != "pd_ee_delta_pos":
            raise UserError(f"the scripted ManiSkill experts drive sim.control_mode=pd_ee_delta_pos, not {self.cfg.control_mode}")
        return make(self.layout)
