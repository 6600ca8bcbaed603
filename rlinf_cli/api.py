"""The contracts between the core and plugins.

Simulator plugins return a :class:`Simulator`; model plugins a :class:`Policy`; algorithm
plugins an :class:`Algorithm`; accelerator plugins an :class:`Accelerator`; executor plugins
an :class:`Executor`; tool plugins a :class:`Tool`. Only plain dataclasses and protocols live here: importing this module
does not import torch.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Protocol, Sequence, runtime_checkable

import numpy as np

from rlinf_cli.hookspecs import API_VERSION  # noqa: F401  (kept in the light hookspecs: the registry reads it)


@dataclass(frozen=True)
class ArraySpec:
    """Shape and dtype of one array (per environment, without the batch dimension).

    ``dtype="str"`` with ``shape=()`` is a text entry: one string per env (a task instruction).
    Batches of it are numpy object arrays; they travel beside the numeric arrays (never through
    torch), and a model reads them only if it lists the key among its observation keys.
    """

    shape: tuple[int, ...]
    dtype: str  # numpy dtype name: "float32", "uint8", "int64"
    low: float | None = None
    high: float | None = None

    @property
    def is_text(self) -> bool:
        return self.dtype == "str"

    def to_dict(self) -> dict[str, Any]:
        return {"shape": list(self.shape), "dtype": self.dtype, "low": self.low, "high": self.high}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "ArraySpec":
        return cls(tuple(int(x) for x in d["shape"]), str(d["dtype"]), d.get("low"), d.get("high"))


@dataclass(frozen=True)
class EnvSpec:
    """What a policy sees and emits.

    ``observation`` maps keys (``state``, ``rgb``, ...) to per-env array specs. ``action`` is
    the per-env action: for a discrete space ``shape == ()`` with ``dtype == "int64"`` and
    ``num_actions`` set; for a continuous space ``shape == (d,)`` float32 with bounds.
    """

    observation: dict[str, ArraySpec]
    action: ArraySpec
    num_actions: int | None = None
    max_episode_steps: int = 1000
    tasks: tuple[str, ...] = ()  # task names for multi-task simulators (index = task id)
    has_success: bool = False  # the simulator reports info["success"]
    # reset(seed) plus the same actions reproduce an episode exactly (resume replays them to
    # restore envs); False for real robots and other non-deterministic simulators
    replayable: bool = True
    # reset(seeds) gives env i the initial state of seeds[i] alone, whatever the other envs'
    # seeds (GRPO groups rely on it). False for batched simulators that seed the whole batch at
    # once (Isaac Lab): GRPO refuses them with one line; PPO and evaluation work unchanged.
    per_env_seeds: bool = True

    @property
    def discrete(self) -> bool:
        return self.num_actions is not None

    def random_actions(self, rng: np.random.Generator, n: int | None = None) -> Any:
        """Uniform random actions: ``n`` of them, or one (continuous bounds default to [-1, 1])."""
        if self.discrete:
            return rng.integers(0, self.num_actions, size=n)
        low = self.action.low if self.action.low is not None else -1.0
        high = self.action.high if self.action.high is not None else 1.0
        return rng.uniform(low, high, size=(*(() if n is None else (n,)), *self.action.shape)).astype(np.float32)

    def to_dict(self) -> dict[str, Any]:
        return {
            "observation": {k: v.to_dict() for k, v in self.observation.items()},
            "action": self.action.to_dict(),
            "num_actions": self.num_actions,
            "max_episode_steps": self.max_episode_steps,
            "tasks": list(self.tasks),
            "has_success": self.has_success,
            # only when False: specs saved before the field existed stay equal to new ones
            **({} if self.replayable else {"replayable": False}),
            **({} if self.per_env_seeds else {"per_env_seeds": False}),
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "EnvSpec":
        return cls(
            observation={k: ArraySpec.from_dict(v) for k, v in d["observation"].items()},
            action=ArraySpec.from_dict(d["action"]),
            num_actions=d.get("num_actions"),
            max_episode_steps=int(d.get("max_episode_steps", 1000)),
            tasks=tuple(d.get("tasks", ())),
            has_success=bool(d.get("has_success", False)),
            replayable=bool(d.get("replayable", True)),
            per_env_seeds=bool(d.get("per_env_seeds", True)),
        )


Obs = dict[str, np.ndarray]

# Multi-task simulators put the task each env runs in the observation under this key: an int64
# scalar indexing EnvSpec.tasks. Models may embed it; evaluation reports success per task.
TASK_KEY = "task_id"


class SingleEnv(Protocol):
    """One environment instance, gymnasium-style, with dict observations.

    ``step`` returns ``(obs, reward, terminated, truncated, info)``; ``info["success"]`` is a
    bool when the task has a notion of success. ``reset(seed=s)`` must make the episode a
    function of ``s`` alone (GRPO groups rely on it).
    """

    def reset(self, *, seed: int | None = None) -> tuple[Obs, dict]: ...

    def step(self, action: np.ndarray) -> tuple[Obs, float, bool, bool, dict]: ...

    def close(self) -> None: ...


@runtime_checkable
class Simulator(Protocol):
    """An embodied simulator plugin object. It must be picklable: executors ship it to workers."""

    spec: EnvSpec

    def make_env(self, index: int) -> SingleEnv:
        """Create env instance ``index`` (0..num_envs-1) in the calling process."""
        ...

    def expert(self) -> "Callable[[Obs, int], np.ndarray] | None":
        """A scripted expert ``(obs of one env, env index) -> action``, or None if there is none."""
        ...

    # Optional attributes the core reads with getattr: ``label`` (titles), ``fps`` (videos),
    # ``with_video(size)``, ``instructions``, and ``normalize_default``: True where running
    # normalization of observations and rewards helps this simulator's tasks (state-based
    # continuous control); ``env.normalize_obs/normalize_reward=auto`` turn it on there
    # (rlinf_cli/runtime/normalize.py: resolve).


@runtime_checkable
class HostedSimulator(Simulator, Protocol):
    """A simulator whose envs live outside this process: on an env server (``sim=remote``), a
    robot's computer. The core starts no env workers for it; it asks it for worker handles
    (:class:`~rlinf_cli.runtime.workers.WorkerHandle`) that reach the envs where they are, and
    step them with the same :class:`~rlinf_cli.runtime.workers.WorkerVecEnv` as local workers
    (see :func:`~rlinf_cli.runtime.hosting.hosted_vec_env`). ``make_env`` still works (one
    remote env each), so an executor that knows nothing of this protocol runs it too.
    """

    def default_workers(self, num_envs: int) -> int:
        """How many sessions (remote workers) ``num_envs`` envs are spread over by default."""
        ...

    def connect_workers(self, shard_lists: Sequence[Sequence[tuple[int, int]]], autoreset: bool, codec: Any,
                        timeout_s: float) -> list[Any]:
        """One ready worker handle per list of ``(lo, hi)`` env ranges."""
        ...

    def describe(self) -> str:
        """Where the envs are, for the run's notes (``3 servers: host:port, ...``)."""
        ...


class BatchedEnv(Protocol):
    """``num_envs`` envs stepped by the simulator's own engine in one call (Isaac Lab, ManiSkill
    on a GPU, any vectorised engine). The core wraps it in
    :class:`~rlinf_cli.runtime.batched.BatchedVecEnv`, which every executor and the env server
    step natively: one call per batched step, no per-env worker processes.

    Batches are numpy arrays or torch tensors (any device) with leading dimension ``num_envs``;
    the core converts them once per step (a view on CPU).

    - ``reset(seeds)``: one seed per env (``None``: the engine's choice). A batch that cannot
      seed envs one by one seeds the whole batch from ``seeds[0]`` and its simulator's spec says
      ``per_env_seeds=False``.
    - ``step(actions)`` (numpy ``[N, *action_shape]``) returns ``(obs, reward, terminated,
      truncated, info)``. Envs that finished are reset by the engine inside the step (its own
      autoreset): their rows of ``obs`` begin the next episode. ``info`` may hold ``"success"``
      (bool ``[N]``) and ``"final_obs"`` (the observations that ended those episodes, rows of the
      finished envs); without ``final_obs``, truncated episodes are bootstrapped from the value of
      the observation before their last step.
    """

    num_envs: int

    def reset(self, seeds: Sequence[int | None]) -> Mapping[str, Any]: ...

    def step(self, actions: np.ndarray) -> tuple[Mapping[str, Any], Any, Any, Any, Mapping[str, Any]]: ...

    def close(self) -> None: ...


@runtime_checkable
class BatchedSimulator(Simulator, Protocol):
    """A simulator that steps many envs as one batch. The core calls :meth:`make_batched_env`
    instead of asking an executor for env workers (:func:`~rlinf_cli.runtime.hosting.hosted_vec_env`), and the
    env server hosts one batched env per session (one round trip per batched step).
    ``make_env(i)`` still gives a single env (a batch of one), for tools that want one."""

    def make_batched_env(self, indices: Sequence[int]) -> BatchedEnv:
        """Create envs ``indices`` (global env indices, contiguous) as one batch in this process."""
        ...


@dataclass
class StepBatch:
    """What a vectorised env returns for one step (leading dim = num_envs)."""

    obs: Obs
    reward: np.ndarray  # float32 [N]
    terminated: np.ndarray  # bool [N]
    truncated: np.ndarray  # bool [N]
    success: np.ndarray  # bool [N]; False where the task has no success notion
    # observation that ended the episode, for envs that finished and were auto-reset (else None)
    final_obs: Obs | None = None
    stats: dict[str, float] = field(default_factory=dict)  # transport bytes, codec time ...


class VecEnv(Protocol):
    """A batch of envs, possibly spread over worker processes or machines.

    ``reset(seeds)`` starts one seed stream per env. ``autoreset=True``: a finished env restarts
    in the same step with the next episode of its stream (``rlinf_cli.runtime.vector.episode_seed``),
    and ``final_obs`` carries the last observation. ``autoreset=False``: finished envs stay
    finished (their rows repeat the last obs with zero reward) until ``reset``.
    ``restore(streams, episodes, actions)`` puts env i at episode ``episodes[i]`` of stream
    ``streams[i]`` after replaying ``actions[i]``: how a resumed run continues running episodes.
    """

    num_envs: int
    spec: EnvSpec

    def reset(self, seeds: Sequence[int]) -> Obs: ...

    def restore(self, streams: Sequence[int], episodes: Sequence[int], actions: Sequence[np.ndarray] | None) -> Obs: ...

    def step(self, actions: np.ndarray) -> StepBatch: ...

    def close(self) -> None: ...


class Executor(Protocol):
    """Places env instances: in this process, in worker processes, or on a cluster.

    Executor plugins subclass ``WorkerExecutor`` (below, in the surface table): its
    ``make_vec_env`` is the core's (placement, hosted and batched simulators, shards, shared
    memory, crash recovery) and calls the plugin's ``start_workers(plan)`` only to start workers.
    """

    def make_vec_env(self, simulator: Simulator, num_envs: int, autoreset: bool) -> VecEnv: ...

    def describe(self) -> str: ...
    # Optional: start_ranks, cluster_report (API 1.3), start_generation_workers, publish_weights, driver_address (1.4): docs/plugins.md


class Accelerator(Protocol):
    """A device family. :class:`rlinf_cli.accel.TorchBackend` implements all of it for backends
    reached through a ``torch.<namespace>`` runtime; a vendor package sets a few attributes."""

    name: str
    visible_devices_env: tuple[str, ...]  # variables restricting the visible devices (first one is set)
    deepspeed_accelerator: str | None  # DeepSpeed's name for it (DS_ACCELERATOR); None: DeepSpeed has none

    def is_available(self) -> bool: ...

    def missing(self) -> str | None: ...  # why it is not usable here; None when it is

    def device_count(self) -> int: ...

    def device(self, rank: int | None = None) -> Any: ...  # torch.device of LOCAL_RANK (or rank)

    def set_device(self, rank: int | None = None) -> None: ...  # make it current (before a process group)

    def dist_backend(self) -> str: ...  # "gloo", "nccl", "hccl", "mccl"

    def supports_bf16(self) -> bool: ...

    def memory_stats(self) -> dict[str, float]: ...  # GiB: allocated, reserved, peak, total

    def launch_env(self, devices: list[int] | None = None) -> dict[str, str]: ...

    def prepare_deepspeed(self) -> None: ...  # before `import deepspeed`

    def describe(self) -> str: ...

    def install_hint(self) -> str | None: ...  # the command that installs what is missing

    def hardware_record(self) -> Any: ...  # rlinf_cli.accel.HardwareRecord from verified.json, or None


# -- text tasks (agentic / reasoning RL) ----------------------------------------------------
# A text task is a simulator-kind plugin registered with ``modality="text"``: instead of envs it
# draws prompts by seed and scores completions. Stages dispatch on the modality; the embodied
# contract above is untouched.

TEXT = "text"


@dataclass(frozen=True)
class TextSample:
    """One prompt of a text task and what is needed to score completions of it."""

    prompt: str  # the question shown to the model (before any chat template)
    answer: str  # the reference answer the reward compares against
    solution: str = ""  # a reference completion in the task's output format (SFT data, `policy=expert`)
    seed: int = 0  # the seed that drew this prompt (a GRPO group shares it)


@dataclass(frozen=True)
class Score:
    """How good one completion is."""

    reward: float  # what RL maximises (correctness, plus any format reward)
    correct: bool  # the extracted answer matches the reference (accuracy, pass@k)
    extracted: str | None = None  # the answer the reward read from the completion (for tables)


@runtime_checkable
class TextTask(Protocol):
    """A text task: prompts by seed, a verifiable reward, optional tool turns.

    An episode is a prompt followed by up to ``max_turns`` model turns. A turn ends at the
    tokenizer's end-of-sequence, at one of ``stop`` strings, or after ``max_new_tokens``.
    After each turn :meth:`tool_response` may return text (a tool's result) that is appended to
    the transcript before the model's next turn; that text is context, not policy output, so
    losses never train on it. The completion scored by :meth:`score` is the transcript after
    the prompt (model turns and tool results). Tasks are plain Python: no torch import.
    """

    modality: str  # "text"
    spec: EnvSpec  # a placeholder spec (TEXT_SPEC) so generic tooling can print something
    max_new_tokens: int  # tokens the model may write per turn
    max_turns: int  # 1 = question -> answer; more = tool calls in between
    stop: tuple[str, ...]  # strings that end a turn (a tool call's closing tag), besides eos

    def prompts(self, seeds: Sequence[int]) -> list[TextSample]:
        """One sample per seed; the same seed always gives the same sample."""
        ...

    def score(self, sample: TextSample, completion: str) -> Score:
        """Reward and correctness of a completion. Never executes model output."""
        ...

    def tool_response(self, sample: TextSample, transcript: str) -> str | None:
        """Text to append after a model turn (e.g. a tool's result), or None: the episode is over."""
        ...

    # Optional, read with getattr (API 1.1): ``tools`` (names of tool plugins the model may call,
    # ``sim.tools``: the prompt describes them, a turn also stops at a call, whose result comes back
    # as a tool message; rlinf_cli/toolcalls.py), ``tool_options`` (per tool, options over its
    # conf/tool/<name>.yaml), ``max_episode_tokens`` (model turns and tool results together).


class ToolError(Exception):
    """A tool's expected failure (a bad expression, code that raised, a limit hit). Its message
    becomes the call's result, ``error: <message>``; the run goes on. Any other exception from a
    tool is caught the same way and counted as a crash."""


@runtime_checkable
class Tool(Protocol):
    """A function a language model may call during a text task's episode (plugin kind ``tool``,
    hook ``register_tools``, factory ``(cfg) -> Tool``).

    ``name`` is how the model calls it; ``description`` and ``parameters`` (JSON schema of the
    arguments object) are what the chat template's ``tools=`` shows. ``call`` gets arguments checked
    against the schema and returns the result text, bounding its own time and output (the core also
    stops waiting after ``timeout_s`` and cuts long results). Optional: ``timeout_s``, ``close()``,
    ``describe()``, ``example`` (arguments for the contract checks) and, on the factory,
    ``example_config(workdir) -> dict`` (options that make a working instance, e.g. a folder).
    """

    name: str
    description: str
    parameters: Mapping[str, Any]

    def call(self, arguments: Mapping[str, Any]) -> str: ...


TEXT_SPEC = EnvSpec(observation={"text": ArraySpec((), "str")}, action=ArraySpec((), "str"),
                    max_episode_steps=1, has_success=True)


# The rest of the plugin surface: what plugins use from the core beyond the contracts above.
# Plugins import these from here, never from the modules behind them (tests/unit/test_plugin_surface.py),
# so the core can move its internals without breaking a plugin. Resolved on first use (PEP 562):
# importing rlinf_cli.api stays torch-free, and a plugin pays for torch only where it asks for it.
_SURFACE: dict[str, tuple[str, str | None]] = {
    # registration and errors
    "hookimpl": ("rlinf_cli.hookspecs", "hookimpl"),
    "UserError": ("rlinf_cli.errors", "UserError"),
    "settings": ("rlinf_cli.settings", None),
    "__version__": ("rlinf_cli", "__version__"),
    "read_rows": ("rlinf_cli.data.jsonl", "read_rows"),
    # text tasks, tools and text models: the tool-call format (tags, parsing, the fallback prompt)
    "toolcalls": ("rlinf_cli.toolcalls", None),
    # models
    **{n: ("rlinf_cli.policy", n) for n in
       ("Policy", "ActOutput", "EvalOutput", "CONFIG_FILE", "MODEL_FILE", "read_model_config")},
    **{n: ("rlinf_cli.runtime.precision", n) for n in ("fp32_matmuls", "onednn_bf16_active")},
    # algorithms
    **{n: ("rlinf_cli.algorithm", n) for n in
       ("Algorithm", "MiniBatch", "OptimSpec", "RolloutSpec", "TrainConfig", "TransitionBatch", "approx_kl",
        "clipped_surrogate", "linear_decay", "masked_mean", "reference_kl", "imitation_loss", "IMITATION_LOSSES")},
    "Experience": ("rlinf_cli.experience", "Experience"),
    # accelerators
    "TorchBackend": ("rlinf_cli.accel", "TorchBackend"),
    "select_accelerator": ("rlinf_cli.stages.common", "select_accelerator"),
    # executors: the core places and hosts the envs (WorkerExecutor.make_vec_env); an executor starts workers
    **{n: ("rlinf_cli.runtime.hosting", n) for n in ("WorkerExecutor", "WorkerPlan")},
    **{n: ("rlinf_cli.runtime.workers", n) for n in ("WorkerHandle", "WorkerDied", "RemoteError")},
    "EnvWorker": ("rlinf_cli.runtime.env_worker", "EnvWorker"),
    "start_processes": ("rlinf_cli.runtime.procs", "start_processes"),
    "cpu_cores": ("rlinf_cli.runtime.placement", "cpu_cores"),  # and trainer ranks (API 1.3):
    **{n: ("rlinf_cli.stages.ranks", n) for n in ("RankJob", "RankDied", "TrainerPlacement", "run_rank")},
    **{n: (f"rlinf_cli.runtime.{m}", n) for m, n in (("generation", "GenerationPlan"), ("generation", "GenerationPlacement"),
       ("gen_worker", "GenerationWorker"), ("gen_worker", "start_generation_processes"))},  # generation workers (API 1.4)
    # simulators, batched and hosted
    "SingleFromBatched": ("rlinf_cli.runtime.batched", "SingleFromBatched"),
    "wire": ("rlinf_cli.remote.wire", None),
    **{n: ("rlinf_cli.remote.client", n) for n in
       ("Endpoint", "RemoteEnv", "RemoteExpert", "open_workers", "server_info")},
}


def __getattr__(name: str) -> Any:
    try:
        module, attr = _SURFACE[name]
    except KeyError:
        raise AttributeError(f"module 'rlinf_cli.api' has no attribute '{name}'") from None
    import importlib

    value = importlib.import_module(module)
    value = value if attr is None else getattr(value, attr)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_SURFACE})
