"""The place an embodied world's envs live: the simulator (built on first use), the executor
that hosts its envs, and the running observation statistics every role acts through.

The roles of an embodied world (policy factory, rollout, evaluator, recorder) share one
:class:`EmbodiedEnv`: a policy that acts in chunks wraps the simulator here once for all of them
(``chunk_for``), and a loaded checkpoint's normalizer is the one they all read.
"""

from __future__ import annotations

from typing import Any, Callable

from rlinf_cli.api import EnvSpec, Executor, Simulator
from rlinf_cli.collectors.roles import EnvSettings
from rlinf_cli.errors import UserError
from rlinf_cli.registry import get_registry, make_simulator
from rlinf_cli.runtime.chunking import ChunkedSimulator, chunk_of
from rlinf_cli.runtime.placement import time_inference
from rlinf_cli.settings import plain


def make_executor(node: Any, runtime: dict[str, Any] | None = None) -> Executor:
    """Build the executor; ``runtime`` (from :func:`runtime_options`) goes in as its ``runtime`` entry."""
    data = dict(plain(node))
    if runtime is not None:
        data["runtime"] = dict(runtime)
    return get_registry().load("executor", data["name"])(data)


def transport_options(runtime: Any, env: Any) -> dict[str, Any]:
    """The ``runtime`` and ``env`` transport settings as one dict for the executor."""
    out: dict[str, Any] = dict(plain(runtime)) if runtime is not None else {}
    if env is not None:
        out.update({"obs_compression": env.get("obs_compression", "none"), "obs_delta": bool(env.get("obs_delta", False)),
                    "compression_level": int(env.get("compression_level", 1))})
    return out


def runtime_options(base: dict[str, Any], act: Callable | None = None, spec: EnvSpec | None = None,
                    num_envs: int | None = None) -> dict[str, Any]:
    """``base`` (:func:`transport_options`) for the executor. With ``runtime.mode=auto`` and a
    policy ``act`` function, the policy's inference time on a batch of ``num_envs`` is measured
    here (``infer_s``); the executor probes the simulator."""
    out = dict(base)
    if out.get("mode") == "auto" and act is not None and spec is not None and num_envs:
        out["infer_s"] = time_inference(act, spec, int(num_envs))
    return out


class EmbodiedEnv:
    """A simulator and its executor, shared by an embodied world's roles."""

    def __init__(self, sim_node: Any, settings: EnvSettings):
        self.settings = settings
        self.device = settings.device
        self._node = sim_node
        self._sim: Simulator | None = None
        self._executor: Executor | None = None
        # running obs/reward statistics (runtime/normalize.py): the loaded checkpoint's (frozen),
        # or the ones an `rl` run updates; None = no normalization
        self.normalizer: Any = None

    @property
    def sim(self) -> Simulator:
        """Built on first use: `sft` on a dataset whose simulator is not installed still trains."""
        if self._sim is None:
            if self._node is None:
                raise UserError("this dataset does not name the simulator that recorded it; pass sim=...")
            self._sim = make_simulator(self._node)
        return self._sim

    @property
    def spec(self) -> EnvSpec:
        return self.sim.spec

    @property
    def label(self) -> str:
        name = plain(self._node).get("name", "sim") if self._node is not None else "dataset"
        return str(getattr(self._sim, "label", None) or name)

    def chunk_for(self, policy: Any) -> None:
        """A policy that emits K actions per step (``action_chunk``) gets envs that execute them:
        the simulator is wrapped once (rlinf_cli/runtime/chunking.py)."""
        k = chunk_of(policy)
        if k > 1 and not isinstance(self.sim, ChunkedSimulator):
            self._sim = ChunkedSimulator(self.sim, k)
            self._executor = None  # placed again for the chunked spec

    def executor(self, act: Callable | None = None, num_envs: int | None = None) -> Executor:
        if self._executor is None:
            self._executor = make_executor(self.settings.executor,
                                           runtime_options(self.settings.runtime, act, self.spec, num_envs))
        return self._executor
