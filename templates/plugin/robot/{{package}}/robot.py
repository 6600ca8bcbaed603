"""The hardware side. ``FakeRobot`` is a cart-pole behind a command latency: replace it with your
robot's driver, keeping the same methods.

A robot class needs:

- ``connect()``: open the connection to the hardware (called once per env, in the server's worker);
- ``home(rng)``: bring the scene to a start configuration (``rng`` can randomise targets; a real
  robot cannot reproduce a physical state from a seed exactly);
- ``command(action)``: send one (already safety-clipped) action;
- ``observe()``: block until the state that follows the last command is known; return it;
- ``failed()``: whether the episode's task has failed (the pole fell, the object dropped);
- ``estop()``: stop all motion now (the emergency-stop callback); ``close()``.
"""

from __future__ import annotations

import math
import time

import numpy as np


class FakeRobot:
    """A cart pushed left or right to balance a pole; ``latency_s`` passes between command and observation."""

    GRAVITY, CART_MASS, POLE_MASS, HALF_LENGTH, MAX_FORCE, DT = 9.8, 1.0, 0.1, 0.5, 10.0, 0.02

    def __init__(self, latency_s: float = 0.05):
        self.latency_s = latency_s
        self.state = np.zeros(4)  # cart position, cart velocity, pole angle, pole angular velocity
        self.stopped = False
        self._sent_at = 0.0

    def connect(self) -> None:
        pass

    def home(self, rng: np.random.Generator) -> None:
        self.state = rng.uniform(-0.05, 0.05, size=4)

    def command(self, action: np.ndarray) -> None:
        if self.stopped:
            return
        x, v, th, w = self.state
        force = float(action[0]) * self.MAX_FORCE
        total = self.CART_MASS + self.POLE_MASS
        pole_ml = self.POLE_MASS * self.HALF_LENGTH
        tmp = (force + pole_ml * w * w * math.sin(th)) / total
        alpha = (self.GRAVITY * math.sin(th) - math.cos(th) * tmp) / (
            self.HALF_LENGTH * (4.0 / 3.0 - self.POLE_MASS * math.cos(th) ** 2 / total))
        acc = tmp - pole_ml * alpha * math.cos(th) / total
        self.state = np.array([x + self.DT * v, v + self.DT * acc, th + self.DT * w, w + self.DT * alpha])
        self._sent_at = time.monotonic()

    def observe(self) -> np.ndarray:
        wait = self._sent_at + self.latency_s - time.monotonic()
        if wait > 0:
            time.sleep(wait)  # the state arrives this long after the command
        return self.state.astype(np.float32)

    def failed(self) -> bool:
        return bool(abs(self.state[0]) > 2.4 or abs(self.state[2]) > 12 * math.pi / 180)

    def estop(self) -> None:
        self.stopped = True

    def close(self) -> None:
        pass
