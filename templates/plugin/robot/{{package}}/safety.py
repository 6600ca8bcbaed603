"""Safety between the policy and the hardware, and a person in the loop.

``Safety`` clips every action to the configured limits before the robot sees it and, when the
observed state leaves the safe region, calls the robot's emergency stop and raises
:class:`EmergencyStop`: the episode ends with an error, training stops with one clear line, and
the robot stays stopped until someone restarts the server.

``Operator`` is the human input: with ``operator=files`` a reset writes ``reset_requested`` in
``operator_dir`` and waits for a ``reset_done`` file (the person has put the scene back); a
``success`` or ``failure`` file written during an episode ends it with that outcome.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Callable

import numpy as np


class EmergencyStop(RuntimeError):
    """The robot was stopped for safety; nothing moves until the server is restarted."""


class Safety:
    def __init__(self, action_limit: float, safe_position: float, estop: Callable[[], None]):
        self.action_limit = float(action_limit)
        self.safe_position = float(safe_position)
        self._estop = estop
        self.stopped_because: str | None = None

    def clip(self, action: np.ndarray) -> np.ndarray:
        if self.stopped_because is not None:
            raise EmergencyStop(f"the robot is emergency-stopped ({self.stopped_because}); restart the server")
        a = np.asarray(action, dtype=np.float64).reshape(-1)
        if not np.isfinite(a).all():
            self.trigger("the policy sent a non-finite action")
        return np.clip(a, -self.action_limit, self.action_limit)

    def check(self, state: np.ndarray) -> None:
        if abs(float(state[0])) > self.safe_position:
            self.trigger(f"cart position {float(state[0]):.2f} outside the safe range +-{self.safe_position:g}")

    def trigger(self, why: str) -> None:
        self._estop()
        self.stopped_because = why
        raise EmergencyStop(f"emergency stop: {why}; the robot is stopped")


class Operator:
    """Resets and success labels from a person (``files``) or from the robot itself (``auto``)."""

    def __init__(self, mode: str, folder: str, timeout_s: float):
        self.mode = mode
        self.folder = Path(folder)
        self.timeout_s = timeout_s

    def request_reset(self, seed: int | None) -> None:
        if self.mode != "files":
            return
        self.folder.mkdir(parents=True, exist_ok=True)
        for name in ("reset_done", "success", "failure"):
            (self.folder / name).unlink(missing_ok=True)
        # written whole, then renamed into place: whoever watches for the file (a person's script,
        # a test) never reads it half-written
        tmp = self.folder / ".reset_requested.tmp"
        tmp.write_text(f"seed {seed}\n")
        tmp.replace(self.folder / "reset_requested")
        deadline = time.monotonic() + self.timeout_s
        while not (self.folder / "reset_done").exists():
            if time.monotonic() > deadline:
                raise TimeoutError(f"no operator confirmed the reset within {self.timeout_s:g} s "
                                   f"(create {self.folder / 'reset_done'} once the scene is ready)")
            time.sleep(0.05)
        (self.folder / "reset_done").unlink(missing_ok=True)
        (self.folder / "reset_requested").unlink(missing_ok=True)

    def outcome(self) -> bool | None:
        """True/False when the person has judged the episode, else None."""
        if self.mode != "files":
            return None
        for name, value in (("success", True), ("failure", False)):
            path = self.folder / name
            if path.exists():
                path.unlink(missing_ok=True)
                return value
        return None
