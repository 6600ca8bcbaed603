"""Fast offscreen rendering of Meta-World scenes on a CPU.

``env.render()`` builds its renderer with shadows, reflections, a skybox and multisampling:
about 10 frames/s on a CPU at 84x84. A ``mujoco.Renderer`` of our own with all of that off
renders the same camera at ~150-190 frames/s (llvmpipe). The ``corner`` cameras are mounted
upside down (their up vector points at the floor), so their images are rotated by 180 degrees.
"""

from __future__ import annotations

import atexit
import weakref
from typing import Any

import numpy as np

from rlinf_cli.api import UserError

# Cameras whose frame has the world's up axis pointing down in the image.
UPSIDE_DOWN = {"corner", "corner2", "corner3", "corner4"}

_LIVE: "weakref.WeakSet[FastRenderer]" = weakref.WeakSet()


def _close_all() -> None:
    # Registered after mujoco's own EGL exit handler, so it runs first: renderers still alive at
    # exit (pooled envs) must free their GL context while the EGL display exists.
    for renderer in list(_LIVE):
        renderer.close()


class FastRenderer:
    """RGB frames of one camera of one MuJoCo model, as ``[H, W, 3]`` uint8, upright."""

    def __init__(self, model: Any, camera: str, height: int, width: int):
        from rlinf_mujoco_gl import lean_renderer

        names = [model.camera(i).name for i in range(model.ncam)]
        if camera not in names:
            raise UserError(f"sim.camera '{camera}' does not exist; this scene has cameras {names}")
        self.renderer = lean_renderer(model, height, width)
        self.camera = camera
        self.flip = camera in UPSIDE_DOWN
        if not _close_all.__dict__.get("registered"):
            atexit.register(_close_all)
            _close_all.registered = True  # type: ignore[attr-defined]
        _LIVE.add(self)

    def render(self, data: Any) -> np.ndarray:
        self.renderer.update_scene(data, camera=self.camera)
        img = self.renderer.render()
        return np.ascontiguousarray(img[::-1, ::-1]) if self.flip else img

    def close(self) -> None:
        _LIVE.discard(self)
        self.renderer.close()
