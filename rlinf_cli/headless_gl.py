"""Headless OpenGL for MuJoCo-based simulators (pixel observations on machines with no display).

MuJoCo picks its GL backend from ``MUJOCO_GL`` once, when ``mujoco`` is first imported; its
default (GLFW) needs a display. A process that imported mujoco for a state-only env earlier
(a test worker, a notebook, a pipeline that ran a state stage first) is left with GLFW, and the
first offscreen renderer then fails with "an OpenGL platform library has not been loaded".
``mujoco.Renderer`` reads ``mujoco.gl_context.GLContext`` when it is built, so the context class
can still be pointed at EGL after the import. Nothing here imports mujoco unless it already is.
"""

from __future__ import annotations

import os
import sys


def prepare_mujoco_gl() -> None:
    """Make MuJoCo's offscreen renderer usable without a display; the user's MUJOCO_GL wins."""
    if not sys.platform.startswith("linux"):
        return
    wanted = os.environ.get("MUJOCO_GL", "").lower().strip()
    if "mujoco" not in sys.modules:
        if not wanted:
            # EGL renders headless: Mesa's llvmpipe on a CPU-only machine, the driver on a GPU.
            os.environ["MUJOCO_GL"] = "egl"
        return
    if os.environ.get("DISPLAY") and wanted in ("", "glfw", "glx"):
        return  # a display exists: GLFW/GLX works
    try:
        import mujoco.gl_context as gl_context
    except ImportError:  # pragma: no cover - a mujoco without GL support
        return
    current = getattr(getattr(gl_context, "GLContext", None), "__module__", "") or ""
    backend = "osmesa" if wanted == "osmesa" else "egl"
    if backend in current:
        return
    try:
        if backend == "osmesa":
            from mujoco.osmesa import GLContext
        else:
            from mujoco.egl import GLContext
    except (ImportError, RuntimeError):
        return  # the library is missing: the renderer's own error names what to install
    gl_context.GLContext = GLContext  # type: ignore[attr-defined]
