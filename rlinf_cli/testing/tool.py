"""The tool contract: a tool built from its own config option describes itself in a schema a chat
template takes, answers its example call with text in time, and meets odd arguments with text or
a ToolError, never another exception."""

from __future__ import annotations

import json
import tempfile
import time
from pathlib import Path
from typing import Any

from rlinf_cli.testing.plugins import option, spec_of
from rlinf_cli.toolcalls import check_arguments, tool_schema
from rlinf_cli.testing.report import Check, Checks

_ODD = {"string": "", "integer": 0, "number": 0, "boolean": False, "array": [], "object": {}}


def tool_checks(name: str, workdir: Path | None = None) -> list[Check]:
    checks = Checks()
    spec = spec_of("tool", name)
    made: list[Any] = []
    with tempfile.TemporaryDirectory(prefix="rlinf-tool-check-") as tmp:
        def construct() -> str:
            factory = spec.load()
            node = option(spec, "tool")
            example = getattr(factory, "example_config", None)
            if callable(example):  # a tool that needs files makes a working instance here
                node.update(example(Path(workdir or tmp) / "example"))
            made.append(factory(node))
            tool = made[0]
            assert tool.name == name, f"the tool calls itself {tool.name!r}; it is registered as {name!r}"
            assert isinstance(tool.description, str) and tool.description.strip(), "description must be a non-empty str"
            return tool.describe() if hasattr(tool, "describe") else tool.description

        if not checks.run(f"construction from conf/tool/{name}.yaml", construct):
            return checks.rows
        tool = made[0]
        checks.run("JSON schema of the arguments (what a chat template's tools= shows)", lambda: _schema(tool))
        checks.run("its example call returns text in time", lambda: _example(tool))
        checks.run("odd arguments: text or ToolError, no other exception", lambda: _odd(tool))
        close = getattr(tool, "close", None)
        if callable(close):
            checks.run("close()", lambda: close() or "")
    return checks.rows


def _schema(tool: Any) -> str:
    params = tool.parameters
    assert isinstance(params, dict) and params.get("type") == "object", 'parameters must be {"type": "object", ...}'
    props = params.get("properties")
    assert isinstance(props, dict), "parameters must list the arguments under properties"
    missing = [k for k in params.get("required", []) if k not in props]
    assert not missing, f"required names arguments without a property: {missing}"
    text = json.dumps(tool_schema(tool))
    return f"{len(props)} argument(s): {', '.join(props)}; schema {len(text)} characters"


def _arguments(tool: Any, odd: bool = False) -> dict[str, Any]:
    """The tool's ``example`` arguments, or a value of each required argument's type."""
    example = getattr(tool, "example", None)
    if example is not None and not odd:
        return dict(example)
    props = tool.parameters.get("properties", {})
    return {k: _ODD.get(str(props.get(k, {}).get("type")), "") for k in tool.parameters.get("required", [])}


def _example(tool: Any) -> str:
    args = _arguments(tool)
    why = check_arguments(args, tool.parameters)
    assert why is None, f"its example arguments do not fit its own schema: {why}"
    limit = float(getattr(tool, "timeout_s", 30.0))
    began = time.monotonic()
    out = tool.call(args)
    took = time.monotonic() - began
    assert isinstance(out, str), f"call() returned {type(out).__name__}; expected str"
    assert took <= limit, f"the example call took {took:.1f} s, more than its timeout_s {limit:g}"
    return f"{json.dumps(args)[:60]} -> {out.strip()[:60]!r} in {took:.2f} s"


def _odd(tool: Any) -> str:
    from rlinf_cli.api import ToolError

    args = _arguments(tool, odd=True)
    try:
        out = tool.call(args)
    except ToolError as exc:
        return f"{json.dumps(args)[:60]} -> ToolError: {str(exc)[:60]}"
    assert isinstance(out, str), f"call() returned {type(out).__name__}; expected str"
    return f"{json.dumps(args)[:60]} -> {out.strip()[:60]!r}"
