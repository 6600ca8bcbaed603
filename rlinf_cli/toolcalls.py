"""How a language model calls tools in text, and how results come back: one format for the core,
the model plugins (prompts) and the tasks (reference solutions).

A call is a JSON object between tags, the convention of Hermes and Qwen chat templates::

    <tool_call>{"name": "calculator", "arguments": {"expression": "123*45"}}</tool_call>

The closing tag ends the model's turn (a stop string). A template that renders tools
(``apply_chat_template(messages, tools=...)``) describes them itself and renders the result as a
tool message. Without such a template (the tiny preset's character tokenizer, SmolLM2's plain
ChatML) the *fallback* applies: :func:`tools_prompt` describes the tools in text before the
prompt (or in the system message) and :func:`result_text` wraps each result::

    <tool_response>5535</tool_response>

Parsing never evaluates model output: ``json.loads`` and nothing else. Pure Python, no torch.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

CALL_OPEN, CALL_CLOSE = "<tool_call>", "</tool_call>"
RESULT_OPEN, RESULT_CLOSE = "<tool_response>", "</tool_response>"
ERROR_PREFIX = "error: "  # how a failed call's message starts, in the tool's result
_JSON_TYPES = {"string": str, "integer": int, "number": (int, float), "boolean": bool, "object": dict,
               "array": list, "null": type(None)}


@dataclass(frozen=True)
class ToolCall:
    """What the model asked for: a tool's name and its arguments (``error`` set when the call is
    malformed: then ``name`` may be empty and the tool is not run)."""

    name: str
    arguments: dict[str, Any] = field(default_factory=dict)
    error: str | None = None


def tool_schema(tool: Any) -> dict[str, Any]:
    """The function description chat templates take in ``tools=`` (OpenAI's shape)."""
    return {"type": "function", "function": {"name": str(tool.name), "description": str(tool.description),
                                             "parameters": dict(tool.parameters)}}


def format_call(name: str, arguments: Mapping[str, Any]) -> str:
    """A call as the model should write it (reference solutions, examples)."""
    return f"{CALL_OPEN}{json.dumps({'name': name, 'arguments': dict(arguments)})}{CALL_CLOSE}"


def result_text(content: str) -> str:
    """A tool's result in the fallback format: what follows a call when the template has no tools."""
    return f"\n{RESULT_OPEN}{content}{RESULT_CLOSE}\n"


def tools_prompt(schemas: Sequence[Mapping[str, Any]]) -> str:
    """The fallback description of the tools: how to call them, then one line per tool,
    ``name(arg: type, ...): description`` (short: a character-level model reads every letter)."""
    lines = []
    for s in schemas:
        fn = s.get("function", s)
        props = (fn.get("parameters") or {}).get("properties") or {}
        args = ", ".join(f"{k}: {v.get('type', 'any')}" for k, v in props.items())
        lines.append(f"- {fn['name']}({args}): {fn.get('description', '')}")
    return (f'Tools (call one as {CALL_OPEN}{{"name": ..., "arguments": {{...}}}}{CALL_CLOSE}; its result comes '
            f"back in {RESULT_OPEN}...{RESULT_CLOSE}):\n" + "\n".join(lines))


def parse_call(turn: str) -> ToolCall | None:
    """The tool call a model turn ends with (its last ``<tool_call>``), or None when it makes none.

    A malformed call (no closing tag, not JSON, no name, arguments not an object) comes back with
    ``error`` set: the model is told, the run goes on. ``arguments`` may also be a JSON string of
    an object (OpenAI's wire format).
    """
    start = turn.rfind(CALL_OPEN)
    if start < 0:
        return None
    body = turn[start + len(CALL_OPEN):]
    end = body.find(CALL_CLOSE)
    if end < 0:
        return ToolCall("", {}, f"the call is not closed with {CALL_CLOSE}")
    try:
        data = json.loads(body[:end].strip())
    except ValueError as exc:
        return ToolCall("", {}, f"the call is not valid JSON ({exc.args[0] if exc.args else exc})")
    if not isinstance(data, dict) or not isinstance(data.get("name"), str) or not data["name"]:
        return ToolCall("", {}, 'the call must be a JSON object with a "name" and "arguments"')
    args = data.get("arguments", data.get("parameters", {}))
    if isinstance(args, str):
        try:
            args = json.loads(args) if args.strip() else {}
        except ValueError:
            return ToolCall(data["name"], {}, "arguments must be a JSON object")
    if not isinstance(args, dict):
        return ToolCall(data["name"], {}, "arguments must be a JSON object")
    return ToolCall(data["name"], args)


def check_arguments(arguments: Mapping[str, Any], schema: Mapping[str, Any]) -> str | None:
    """Why ``arguments`` do not fit a tool's JSON schema (required keys, unknown keys where
    ``additionalProperties`` is false, the types of known keys, enums), or None when they do. A
    subset of JSON Schema: what function-call schemas use."""
    props = schema.get("properties") or {}
    missing = [k for k in schema.get("required") or () if k not in arguments]
    if missing:
        return f"missing argument(s): {', '.join(missing)}"
    if schema.get("additionalProperties") is False:
        extra = [k for k in arguments if k not in props]
        if extra:
            return f"unknown argument(s): {', '.join(extra)}; expected {', '.join(props) or 'none'}"
    for key, value in arguments.items():
        spec = props.get(key) or {}
        types = spec.get("type")
        wanted = [types] if isinstance(types, str) else list(types or [])
        if wanted and not any(_is(value, t) for t in wanted):
            return f"argument {key!r} must be {' or '.join(wanted)}, got {type(value).__name__}"
        if "enum" in spec and value not in spec["enum"]:
            return f"argument {key!r} must be one of {spec['enum']}"
    return None


def _is(value: Any, json_type: str) -> bool:
    py = _JSON_TYPES.get(json_type)
    if py is None:
        return True  # a type this checker does not know: the tool checks it
    if isinstance(value, bool) and json_type in ("integer", "number"):
        return False
    if json_type == "integer" and isinstance(value, float):
        return value.is_integer()
    return isinstance(value, py)
