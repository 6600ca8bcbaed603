"""Env instances on this machine, stepped in this process."""

from __future__ import annotations

from typing import Any, Mapping

from rlinf_cli.api import Simulator, VecEnv
from rlinf_cli.runtime.vector import SyncVecEnv


class LocalExecutor:
    def __init__(self, cfg: Mapping[str, Any]):
        self.cfg = dict(cfg)

    def make_vec_env(self, simulator: Simulator, num_envs: int, autoreset: bool) -> VecEnv:
        return SyncVecEnv(simulator, range(num_envs), autoreset=autoreset)

    def describe(self) -> str:
        return "local (in-process)"
