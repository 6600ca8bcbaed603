"""Isaac Lab 3 tasks behind rlinf's batched-simulator contract (:class:`~rlinf_cli.api.BatchedSimulator`).

- One Isaac Lab env holds the whole batch (``num_envs`` of the stage, or of an env-server
  session) and steps it in one call: kit-less, on the Newton physics backend, on the device the
  accelerator plugin picks (``sim.device=auto``: ``cuda:0`` where rlinf-accel-cuda finds a GPU,
  else ``cpu``).
- Observations: Isaac Lab's observation groups become observation keys. The ``policy`` group
  (``sim.state_group``) is ``state``, what rlinf's models read by default; other groups
  (``critic``, camera groups) keep their names; a group of separate terms
  (``concatenate_terms=False``) gives ``<group>_<term>`` keys.
- ``terminated`` / ``truncated`` are Isaac Lab's ``reset_terminated`` / ``reset_time_outs``.
  Isaac Lab resets finished envs inside its step; ``compute_final_obs`` is switched on so the
  observation that ended an episode still reaches the runtime (truncated episodes are
  bootstrapped from it).
- Success (``sim.success``): ``time_out`` counts an episode that reached its time limit without
  terminating as solved (Isaac Lab's own ``Metrics/success_rate`` for the cart-pole and the
  locomotion tasks, which logs survival); ``terminated`` counts a termination as success (goal-reaching tasks, as Isaac
  Lab's hook for upstream RLinf does); ``none``; ``auto`` picks per task (``SUCCESS``).
- Seeds: Isaac Lab seeds the whole batch (torch, numpy, warp) from one number, so
  ``reset(seeds)`` seeds the batch from ``seeds[0]``: an initial state is a function of the seed
  list, not of each env's seed. The spec says ``per_env_seeds=False`` (GRPO refuses, PPO and
  evaluation work) and ``replayable=False`` (the engine reseeds its own resets; a resumed run
  starts fresh episodes).
- Assets: Isaac Lab reads robots and ground planes from ``sim.asset_root`` (or
  ``$ISAACSIM_ASSET_ROOT``), else NVIDIA's asset server. Every asset a task names is checked
  before the env is built: a missing local file, or a server that does not answer within
  ``sim.asset_timeout_s``, is one line naming the asset and how to provide it (instead of Isaac
  Lab's ~46 s of retries and a traceback).

Isaac Lab 3.0.0 needs Python 3.12: ``make isaaclab`` builds ``.venv-isaaclab`` (Isaac Lab, rlinf
without its training dependencies, this plugin, a local asset root), served to the trainer with
``rlinf env serve sim=isaaclab`` and ``sim=remote`` (docs/isaaclab.md).
"""

from __future__ import annotations

import difflib
import math
import os
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import numpy as np

from rlinf_cli.api import settings, ArraySpec, EnvSpec, UserError

SUCCESS_MODES = ("auto", "time_out", "terminated", "none")
# sim.success=auto: tasks whose success Isaac Lab itself defines as survival (its
# Metrics/success_rate / survival_success_rate: timed out without failing)
SUCCESS = {task: "time_out" for task in ("Isaac-Cartpole-Direct", "Isaac-Cartpole", "Isaac-Ant-Direct", "Isaac-Ant",
                                         "Isaac-Humanoid-Direct", "Isaac-Humanoid")}
INSTALL_HINT = ("Isaac Lab 3 needs Python 3.12: `make isaaclab` builds .venv-isaaclab with it; serve the task from "
                "there with `.venv-isaaclab/bin/rlinf env serve sim=isaaclab sim.task=...` and train with sim=remote "
                "(docs/isaaclab.md)")


@dataclass(frozen=True)
class IsaacLabConfig:
    task: str = "Isaac-Cartpole-Direct"  # an Isaac Lab task id ("-v0" of older releases is accepted)
    device: str = "auto"  # auto: the accelerator plugin's device (cuda:0 with an NVIDIA GPU, else cpu) | cpu | cuda:N
    asset_root: str | None = None  # local Isaac asset root; null = $ISAACSIM_ASSET_ROOT, else NVIDIA's server
    asset_timeout_s: float = 5.0  # how long to wait for the asset server before failing with one line
    state_group: str = "policy"  # the observation group that becomes the `state` key
    success: str = "auto"  # auto | time_out | terminated | none
    action_bound: float = 1.0  # actions are clipped to [-bound, bound] (Isaac Lab scales them itself); 0 = unbounded
    torch_threads: int = 1  # torch CPU threads in the process that steps the envs (0 = leave as is)

    def __post_init__(self) -> None:
        if self.success not in SUCCESS_MODES:
            raise ValueError(f"success must be one of {', '.join(SUCCESS_MODES)}, got {self.success!r}")
        if self.asset_timeout_s <= 0 or self.action_bound < 0 or self.torch_threads < 0:
            raise ValueError("asset_timeout_s must be positive; action_bound and torch_threads not negative")


def _isaaclab() -> Any:
    """Import Isaac Lab's task registry (after pointing it at the asset root)."""
    try:
        import isaaclab_tasks  # noqa: F401  (registers the task ids with gymnasium)
        from isaaclab_tasks.utils import parse_env_cfg
    except ImportError as exc:
        import sys

        py = f"{sys.version_info.major}.{sys.version_info.minor}"
        raise UserError(f"sim=isaaclab: Isaac Lab is not importable here (Python {py}: {exc}). {INSTALL_HINT}") from exc
    return parse_env_cfg


def resolve_task(task: str) -> str:
    """The registered id of ``task`` (Isaac Lab 3 dropped the ``-v0`` suffix of earlier releases)."""
    import gymnasium as gym

    ids = [k for k in gym.registry if k.startswith("Isaac-")]
    if task in ids:
        return task
    if task.endswith("-v0") and task[:-3] in ids:
        return task[:-3]
    close = difflib.get_close_matches(task, ids, n=3)
    hint = f"; did you mean {', '.join(close)}?" if close else f" (Isaac Lab registers {len(ids)} tasks named Isaac-*)"
    raise UserError(f"sim.task={task} is not an Isaac Lab task{hint}")


def asset_paths(cfg: Any) -> list[str]:
    """Every ``usd_path`` an env config names, and the ground plane Isaac Lab spawns by default."""
    found: list[str] = []
    seen: set[int] = set()

    def walk(node: Any, depth: int) -> None:
        if depth > 12 or id(node) in seen or node is None or isinstance(node, (str, bytes, int, float, bool)):
            return
        seen.add(id(node))
        items = node.items() if isinstance(node, Mapping) else (
            vars(node).items() if hasattr(node, "__dict__") and not isinstance(node, type) else ())
        for key, value in items:
            if key == "usd_path" and isinstance(value, str) and value:
                found.append(value)
            elif isinstance(value, (list, tuple)):
                for v in value:
                    walk(v, depth + 1)
            else:
                walk(value, depth + 1)

    walk(cfg, 0)
    try:
        from isaaclab.sim.spawners.from_files.from_files_cfg import GroundPlaneCfg

        found.append(GroundPlaneCfg().usd_path)
    except Exception:  # another Isaac Lab layout: the task's own paths are still checked
        pass
    return list(dict.fromkeys(found))


def check_assets(paths: Sequence[str], task: str, timeout_s: float) -> None:
    """One clear line for the first asset that cannot be had, before Isaac Lab retries for ~46 s."""
    how = ("build a local asset root with `make isaaclab` (or `python -m rlinf_sim_isaaclab.assets DIR`) and pass "
           "sim.asset_root=DIR (or set ISAACSIM_ASSET_ROOT)")
    remote = [p for p in paths if p.startswith(("http://", "https://", "omniverse://"))]
    for p in paths:
        if p not in remote and not os.path.isfile(p):
            raise UserError(f"sim=isaaclab sim.task={task}: asset missing: {p}. The asset root has no such file: {how}; "
                            f"tasks whose robots it lacks need NVIDIA's asset server")
    web = [p for p in remote if p.startswith(("http://", "https://"))]  # omniverse:// is Isaac Sim's client's
    if web:
        import urllib.error
        import urllib.request

        url = web[0]
        try:
            urllib.request.urlopen(urllib.request.Request(url, method="HEAD"), timeout=timeout_s).close()
        except urllib.error.HTTPError as exc:
            if exc.code == 404:
                raise UserError(f"sim=isaaclab sim.task={task}: asset missing on the server: {url} (HTTP 404)") from None
        except (OSError, ValueError) as exc:
            raise UserError(f"sim=isaaclab sim.task={task}: cannot reach NVIDIA's asset server for {url} within "
                            f"{timeout_s:g} s ({getattr(exc, 'reason', exc)}): {how}") from None


def _space_spec(space: Any) -> ArraySpec:
    dtype = np.dtype(getattr(space, "dtype", np.float32) or np.float32)
    return ArraySpec(tuple(int(x) for x in space.shape), "float32" if dtype.kind == "f" else dtype.name)


def _cfg_space(value: Any) -> ArraySpec | None:
    """An ArraySpec from a Direct env config's space (an int, a list of dims or a gym Box)."""
    if isinstance(value, int):
        return ArraySpec((value,), "float32") if value > 0 else None
    if isinstance(value, (list, tuple)) and all(isinstance(x, int) for x in value):
        return ArraySpec(tuple(value), "float32")
    if hasattr(value, "shape") and hasattr(value, "dtype"):
        return _space_spec(value)
    return None


def obs_key(group: str, state_group: str, term: str | None = None) -> str:
    base = "state" if group == state_group else group
    return base if term is None else f"{base}_{term}"


def flatten_obs(obs: Mapping[str, Any], state_group: str) -> dict[str, Any]:
    """Isaac Lab's observation groups -> rlinf keys (tensors untouched)."""
    out: dict[str, Any] = {}
    for group, value in obs.items():
        if isinstance(value, Mapping):
            for term, v in value.items():
                out[obs_key(group, state_group, term)] = v
        else:
            out[obs_key(group, state_group)] = value
    return out


class IsaacLabSimulator:
    """``sim=isaaclab``. Building the simulator reads the task's config (no env); envs are built
    by :meth:`make_batched_env` in the process that steps them."""

    def __init__(self, cfg: Mapping[str, Any]):
        self.cfg = settings.build(IsaacLabConfig, cfg, "sim")
        self._prepare_process()
        parse_env_cfg = _isaaclab()
        self.task = resolve_task(self.cfg.task)
        self.label = f"isaaclab/{self.task}"  # for titles, tables and env-server logs
        env_cfg = parse_env_cfg(self.task, device="cpu", num_envs=1)
        check_assets(asset_paths(env_cfg), self.task, self.cfg.asset_timeout_s)
        self.success = self.cfg.success if self.cfg.success != "auto" else SUCCESS.get(self.task, "none")
        self.spec = self._spec(env_cfg)

    # -- spec ------------------------------------------------------------------------------
    def _spec(self, env_cfg: Any) -> EnvSpec:
        obs: dict[str, ArraySpec] | None = None
        state = _cfg_space(getattr(env_cfg, "observation_space", None))
        action = _cfg_space(getattr(env_cfg, "action_space", None))
        if state is not None and action is not None:  # a Direct env: its config says it all
            obs = {"state": state}
            critic = _cfg_space(getattr(env_cfg, "state_space", None))
            if critic is not None:
                obs["critic"] = critic
            if self.cfg.state_group != "policy":
                obs = None  # other groups are named by the env itself: ask it below
        if obs is None or action is None:  # manager-based envs: their spaces exist once built
            env = self._build(1)
            try:
                return self._spec_from(env.unwrapped, env_cfg)
            finally:
                env.close()
        bound = self.cfg.action_bound or None
        act = ArraySpec(action.shape, "float32", -bound if bound else None, bound)
        return EnvSpec(obs, act, max_episode_steps=self._horizon(env_cfg), has_success=self.success != "none",
                       replayable=False, per_env_seeds=False)

    def _spec_from(self, env: Any, env_cfg: Any) -> EnvSpec:
        space = env.single_observation_space
        obs: dict[str, ArraySpec] = {}
        for group, sub in space.spaces.items():
            if hasattr(sub, "spaces"):
                for term, s in sub.spaces.items():
                    obs[obs_key(group, self.cfg.state_group, term)] = _space_spec(s)
            else:
                obs[obs_key(group, self.cfg.state_group)] = _space_spec(sub)
        a = _space_spec(env.single_action_space)
        bound = self.cfg.action_bound or None
        return EnvSpec(obs, ArraySpec(a.shape, "float32", -bound if bound else None, bound),
                       max_episode_steps=self._horizon(env_cfg), has_success=self.success != "none",
                       replayable=False, per_env_seeds=False)

    @staticmethod
    def _horizon(env_cfg: Any) -> int:
        step_dt = float(env_cfg.sim.dt) * int(env_cfg.decimation)
        return int(math.ceil(float(env_cfg.episode_length_s) / step_dt - 1e-9))

    # -- envs ------------------------------------------------------------------------------
    def _prepare_process(self) -> None:
        """Before Isaac Lab is imported in this process: the asset root (read at import) and threads."""
        if self.cfg.asset_root:
            root = os.path.abspath(os.path.expanduser(self.cfg.asset_root))
            if not os.path.isdir(root):
                raise UserError(f"sim.asset_root={self.cfg.asset_root}: no such directory (`make isaaclab` builds "
                                f".venv-isaaclab/isaac-assets)")
            import sys

            loaded = sys.modules.get("isaaclab.utils.assets")
            if loaded is not None and getattr(loaded, "NUCLEUS_ASSET_ROOT_DIR", root) != root:
                raise UserError(f"sim.asset_root={root}: Isaac Lab was already imported in this process with the asset "
                                f"root {loaded.NUCLEUS_ASSET_ROOT_DIR}; set ISAACSIM_ASSET_ROOT before starting instead")
            os.environ["ISAACSIM_ASSET_ROOT"] = root
        if self.cfg.torch_threads:
            import torch

            torch.set_num_threads(self.cfg.torch_threads)

    def device(self) -> str:
        if self.cfg.device != "auto":
            return self.cfg.device
        from rlinf_cli.api import select_accelerator

        return str(select_accelerator("auto").device())

    def _build(self, num_envs: int) -> Any:
        import gymnasium as gym

        parse_env_cfg = _isaaclab()
        env_cfg = parse_env_cfg(self.task, device=self.device(), num_envs=int(num_envs))
        if hasattr(env_cfg, "compute_final_obs"):
            env_cfg.compute_final_obs = True  # the observation that ended an episode, before Isaac Lab resets it
        check_assets(asset_paths(env_cfg), self.task, self.cfg.asset_timeout_s)
        return gym.make(self.task, cfg=env_cfg)

    def make_batched_env(self, indices: Sequence[int]) -> "IsaacLabBatch":
        self._prepare_process()
        from rlinf_sim_isaaclab.batch import IsaacLabBatch

        return IsaacLabBatch(self._build(len(indices)), self.cfg.state_group, self.success, self.cfg.action_bound)

    def make_env(self, index: int) -> Any:
        from rlinf_cli.api import SingleFromBatched

        return SingleFromBatched(self.spec, self.make_batched_env([index]))

    def expert(self) -> None:
        return None
