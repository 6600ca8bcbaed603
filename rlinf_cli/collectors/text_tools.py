"""The tools of a text task's episodes: built once per run from tool plugins, called with the
model's parsed calls, and never allowed to break the run.

Every way a call can fail becomes the call's result, ``error: ...``, which the model reads like
any other result: a malformed call, an unknown tool, arguments that do not fit the schema, a
tool that raised (:class:`~rlinf_cli.api.ToolError`: expected; anything else: a crash) or one that
did not answer within its ``timeout_s``. Calls of one batch run side by side in daemon threads
(a tool that never returns costs its thread, not the run or the interpreter's exit).
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from rlinf_cli.api import ToolError
from rlinf_cli.errors import UserError
from rlinf_cli.registry import get_registry
from rlinf_cli.settings import plain
from rlinf_cli.toolcalls import ERROR_PREFIX, ToolCall, check_arguments, tool_schema

DEFAULT_TIMEOUT_S = 30.0  # a tool without its own timeout_s
MAX_RESULT_CHARS = 4000  # longer results are cut (a tool should cut its own output well before)
PARALLEL_CALLS = 4  # calls running at once; the python tool's sandboxes are processes
ERROR_KINDS = ("malformed", "unknown_tool", "bad_arguments", "tool_error", "timeout", "crash")


@dataclass(frozen=True)
class ToolResult:
    """What a call returned: the text the model reads, and the kind of failure (None: it worked)."""

    text: str
    error: str | None = None  # one of ERROR_KINDS

    @property
    def ok(self) -> bool:
        return self.error is None


def tool_config(name: str, options: Mapping[str, Any] | None) -> dict[str, Any]:
    """A tool's config: its plugin's ``conf/tool/<name>.yaml`` with ``options`` over it."""
    from omegaconf import OmegaConf

    spec = get_registry().get("tool", name)
    node: dict[str, Any] = {"name": name}
    path = spec.conf_dir / "tool" / f"{name}.yaml" if spec.conf_dir is not None else None
    if path is not None and path.is_file():
        node.update(OmegaConf.to_container(OmegaConf.load(path), resolve=True) or {})
    node.update(plain(options) or {})
    return node


class Toolbox:
    """The tools one run's episodes may call (empty: no tool turns)."""

    def __init__(self, tools: Sequence[Any] = ()):
        self.tools = {t.name: t for t in tools}
        self.schemas = [tool_schema(t) for t in tools]

    def __bool__(self) -> bool:
        return bool(self.tools)

    @classmethod
    def for_task(cls, task: Any) -> "Toolbox":
        """The tools ``task`` names (``sim.tools``), configured by its ``tool_options``."""
        names = [str(n) for n in (getattr(task, "tools", None) or ())]
        options = dict(plain(getattr(task, "tool_options", None)) or {})
        registered = get_registry().specs("tool")
        for name in [*names, *options]:
            if name not in registered:
                get_registry().get("tool", name)  # the registry's line: installed tools, a near match
        if len(set(names)) != len(names):
            raise UserError(f"sim.tools lists a tool twice: {names}")
        tools = []
        for name in names:
            tool = get_registry().load("tool", name)(tool_config(name, options.get(name)))
            if getattr(tool, "name", None) != name:
                raise UserError(f"tool plugin '{name}' built a tool named {getattr(tool, 'name', None)!r}; "
                                f"its name must be the registered one")
            tools.append(tool)
        return cls(tools)

    def describe(self) -> list[str]:
        """One line per tool for the run's notes."""
        return [f"tool {n}: {t.describe() if hasattr(t, 'describe') else t.description}" for n, t in self.tools.items()]

    def run(self, calls: Sequence[ToolCall]) -> list[ToolResult]:
        """The results of ``calls``, in order; a few at a time, each bounded by its tool's timeout."""
        results: list[ToolResult | None] = [self._refuse(c) for c in calls]
        todo = [i for i, r in enumerate(results) if r is None]
        for start in range(0, len(todo), PARALLEL_CALLS):
            wave = todo[start:start + PARALLEL_CALLS]
            boxes: list[list[ToolResult]] = [[] for _ in wave]
            threads = [threading.Thread(target=self._call, args=(calls[i], box), daemon=True)
                       for i, box in zip(wave, boxes)]
            began = time.monotonic()
            for t in threads:
                t.start()
            for i, t, box in zip(wave, threads, boxes):
                limit = float(getattr(self.tools[calls[i].name], "timeout_s", DEFAULT_TIMEOUT_S))
                t.join(max(0.0, began + limit - time.monotonic()))
                results[i] = box[0] if box else ToolResult(
                    f"{ERROR_PREFIX}the tool '{calls[i].name}' did not answer within {limit:g} s", "timeout")
        return [r for r in results if r is not None]

    def _refuse(self, call: ToolCall) -> ToolResult | None:
        """The result of a call that cannot run (malformed, unknown tool, bad arguments), else None."""
        if call.error is not None:
            return ToolResult(f"{ERROR_PREFIX}{call.error}", "malformed")
        tool = self.tools.get(call.name)
        if tool is None:
            return ToolResult(f"{ERROR_PREFIX}unknown tool {call.name[:60]!r}; the tools are "
                              f"{', '.join(self.tools)}", "unknown_tool")
        why = check_arguments(call.arguments, tool.parameters)
        return None if why is None else ToolResult(f"{ERROR_PREFIX}{why}", "bad_arguments")

    def _call(self, call: ToolCall, box: list[ToolResult]) -> None:
        try:
            text = self.tools[call.name].call(call.arguments)
            result = ToolResult(text if isinstance(text, str) else str(text))
        except ToolError as exc:
            result = ToolResult(f"{ERROR_PREFIX}{exc}", "tool_error")
        except Exception as exc:  # a broken tool is the model's error message, never the run's end
            result = ToolResult(f"{ERROR_PREFIX}the tool crashed ({type(exc).__name__}: {exc})", "crash")
        if len(result.text) > MAX_RESULT_CHARS:
            result = ToolResult(result.text[:MAX_RESULT_CHARS] + "\n[cut]", result.error)
        box.append(result)

    def close(self) -> None:
        for tool in self.tools.values():
            close = getattr(tool, "close", None)
            if callable(close):
                close()


NO_TOOLS = Toolbox()

