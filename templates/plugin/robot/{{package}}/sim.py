"""The robot as an rlinf simulator: ``step`` goes through the safety layer to the hardware.

Serve it on the robot's computer (``rlinf env serve sim={{name}} max_envs=1``) and train with
``sim=remote``. With the fake robot, several envs can run at once (each its own fake cart-pole);
a real robot is one env.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

import numpy as np

from rlinf_cli.api import ArraySpec, EnvSpec
from {{package}}.robot import FakeRobot
from {{package}}.safety import Operator, Safety

# A robot cannot replay an episode from its seed (issue: exact resume); say so where the spec can.
_NOT_REPLAYABLE = {"replayable": False} if "replayable" in {f.name for f in dataclasses.fields(EnvSpec)} else {}


class RobotEnv:
    def __init__(self, cfg: Mapping[str, Any]):
        self.cfg = cfg
        if cfg.get("hardware", "fake") != "fake":
            raise ValueError(f"unknown hardware {cfg.get('hardware')!r}: add your driver in robot.py and select it here")
        self.robot = FakeRobot(float(cfg.get("latency_s", 0.05)))
        self.robot.connect()
        self.safety = Safety(float(cfg.get("action_limit", 1.0)), float(cfg.get("safe_position", 3.0)), self.robot.estop)
        self.operator = Operator(str(cfg.get("operator", "auto")), str(cfg.get("operator_dir", "operator")),
                                 float(cfg.get("operator_timeout_s", 600)))
        self.max_steps = int(cfg.get("max_episode_steps", 200))
        self.rng = np.random.default_rng()
        self.t = 0

    def reset(self, *, seed: int | None = None) -> tuple[dict[str, np.ndarray], dict]:
        if seed is not None:
            self.rng = np.random.default_rng(seed)
        self.operator.request_reset(seed)
        self.robot.home(self.rng)
        self.t = 0
        return {"state": self.robot.observe()}, {}

    def step(self, action: Any) -> tuple[dict[str, np.ndarray], float, bool, bool, dict]:
        self.robot.command(self.safety.clip(action))
        state = self.robot.observe()
        self.safety.check(state)
        self.t += 1
        judged = self.operator.outcome()
        failed = self.robot.failed() if judged is None else not judged
        truncated = not failed and self.t >= self.max_steps
        success = bool(judged) if judged is not None else truncated  # the fake's task: balance to the end
        return {"state": state}, 1.0, failed or judged is not None, truncated, {"success": success}

    def close(self) -> None:
        self.robot.close()


class Simulator:
    def __init__(self, cfg: Mapping[str, Any]):
        self.cfg = {k: v for k, v in dict(cfg).items() if k != "name"}
        limit = float(self.cfg.get("action_limit", 1.0))
        self.spec = EnvSpec(observation={"state": ArraySpec((4,), "float32")},
                            action=ArraySpec((1,), "float32", -limit, limit),
                            max_episode_steps=int(self.cfg.get("max_episode_steps", 200)), has_success=True,
                            **_NOT_REPLAYABLE)

    def make_env(self, index: int) -> RobotEnv:
        return RobotEnv(self.cfg)

    def expert(self):
        return None
