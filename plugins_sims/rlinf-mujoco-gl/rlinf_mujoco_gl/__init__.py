"""Headless OpenGL for MuJoCo-based simulators (pixel observations on machines with no display),
and the lean offscreen renderer they share.

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
from typing import Any


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


def lean_renderer(model: Any, height: int, width: int) -> Any:
    """A ``mujoco.Renderer`` for ``model`` with what costs most on a CPU turned off.

    Multisampling, shadows, reflections and the skybox make up most of an offscreen frame's cost
    under Mesa's llvmpipe at policy-sized images (``env.render()`` keeps them all on). The
    model's offscreen buffer is enlarged to the image size if needed. A GL failure becomes one
    :class:`~rlinf_cli.errors.UserError` that says what to install.
    """
    prepare_mujoco_gl()  # this may be a worker process that imported mujoco for another env
    import mujoco

    from rlinf_cli.api import UserError

    model.vis.quality.offsamples = 0
    model.vis.global_.offwidth = max(int(model.vis.global_.offwidth), width)
    model.vis.global_.offheight = max(int(model.vis.global_.offheight), height)
    try:
        renderer = mujoco.Renderer(model, height, width)
    except Exception as exc:  # GL errors come as several exception types
        first = str(exc).splitlines()[0] if str(exc) else ""
        raise UserError(
            f"offscreen rendering failed with MUJOCO_GL={os.environ.get('MUJOCO_GL', '')!r} ({type(exc).__name__}: {first}); "
            "install EGL (apt-get install libegl1 libegl-mesa0) or OSMesa (apt-get install libosmesa6, MUJOCO_GL=osmesa), "
            "or use sim.obs=state") from exc
    flags = renderer.scene.flags
    for flag in (mujoco.mjtRndFlag.mjRND_SHADOW, mujoco.mjtRndFlag.mjRND_REFLECTION, mujoco.mjtRndFlag.mjRND_SKYBOX):
        flags[flag] = False
    return renderer
