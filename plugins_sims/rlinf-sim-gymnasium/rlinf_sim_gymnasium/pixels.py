"""Camera images for gymnasium's MuJoCo envs, rendered offscreen with a lean MuJoCo renderer.

``env.render()`` in gymnasium renders with shadows, reflections, a skybox and multisampling;
at 84x84 on a CPU (Mesa llvmpipe through EGL) that costs several times the physics step. Our
own :class:`mujoco.Renderer` turns those off (``offsamples=0``, no shadow/reflection/skybox
flags) and reuses one scene, which renders 84x84 frames at ~300-900 frames/s on one core.
The renderer is created on first use inside the process that steps the env (an env worker),
so no GL context ever crosses a process boundary.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from rlinf_cli.api import ArraySpec, Obs, UserError


def image_spec(size: int) -> ArraySpec:
    return ArraySpec((size, size, 3), "uint8", 0.0, 255.0)


def check_mujoco(env: Any, env_id: str) -> None:
    base = env.unwrapped
    if not (hasattr(base, "model") and hasattr(base, "data")):
        raise UserError(f"sim.obs=rgb needs a MuJoCo env; '{env_id}' is not one (use sim.obs=state)")


class PixelEnv:
    """Adds ``rgb`` ([H, W, 3] uint8) to a dict-observation MuJoCo env (and drops ``state`` for obs=rgb)."""

    def __init__(self, env: Any, size: int, camera: str | int | None, keep_state: bool):
        self.env = env
        self.size = size
        self.camera = camera
        self.keep_state = keep_state
        self._renderer: Any = None
        self._cam: Any = None

    def _setup(self) -> None:
        try:
            import mujoco
        except ImportError as exc:  # pragma: no cover - gymnasium[mujoco] brings it
            raise UserError(f"sim.obs=rgb needs the mujoco package: {exc}") from exc
        from rlinf_mujoco_gl import lean_renderer

        base = self.env.env.unwrapped
        model = base.model
        self._renderer = lean_renderer(model, self.size, self.size)
        if self.camera is not None:
            self._cam = self.camera
            return
        # the env's own default view (gymnasium's default_camera_config): free or body-tracking
        cam = mujoco.MjvCamera()
        mujoco.mjv_defaultFreeCamera(model, cam)
        renderer = getattr(base, "mujoco_renderer", None)
        for key, value in (getattr(renderer, "default_cam_config", None) or {}).items():
            if key == "trackbodyid":
                cam.type = mujoco.mjtCamera.mjCAMERA_TRACKING
                cam.trackbodyid = int(value)
            elif key == "lookat":
                cam.lookat[:] = value
            elif hasattr(cam, key):
                setattr(cam, key, value)
        self._cam = cam

    def _render(self) -> np.ndarray:
        if self._renderer is None:
            self._setup()
        base = self.env.env.unwrapped
        try:
            self._renderer.update_scene(base.data, camera=self._cam)
        except ValueError as exc:
            raise UserError(f"sim.camera={self.camera!r}: {exc}") from exc
        return self._renderer.render()

    def _obs(self, obs: Obs) -> Obs:
        out = dict(obs) if self.keep_state else {}
        out["rgb"] = self._render()
        return out

    def reset(self, *, seed: int | None = None) -> tuple[Obs, dict]:
        obs, info = self.env.reset(seed=seed)
        return self._obs(obs), info

    def step(self, action: np.ndarray) -> tuple[Obs, float, bool, bool, dict]:
        obs, reward, terminated, truncated, info = self.env.step(action)
        return self._obs(obs), reward, terminated, truncated, info

    def close(self) -> None:
        if self._renderer is not None:
            self._renderer.close()
            self._renderer = None
        self.env.close()
