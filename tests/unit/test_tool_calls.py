"""Tool calls as the model writes them: parsing (good, malformed), and the toolbox turning every
failure (unknown tool, bad arguments, a tool that raises, crashes or hangs) into an error message."""

from __future__ import annotations

import time

import pytest

from rlinf_cli.api import Tool, ToolError
from rlinf_cli.collectors.text_tools import Toolbox
from rlinf_cli.errors import UserError
from rlinf_cli.toolcalls import ToolCall, check_arguments, format_call, parse_call, tool_schema, tools_prompt


class Echo:
    name, description = "echo", "Repeats its text n times."
    parameters = {"type": "object", "properties": {"text": {"type": "string"}, "n": {"type": "integer"}},
                  "required": ["text"], "additionalProperties": False}
    timeout_s = 1.0

    def call(self, arguments):
        if arguments["text"] == "raise":
            raise ToolError("asked to fail")
        if arguments["text"] == "crash":
            return {}["missing"]
        if arguments["text"] == "hang":
            time.sleep(30)
        return arguments["text"] * int(arguments.get("n", 1))


@pytest.mark.parametrize("turn, name, args", [
    ('<tool_call>{"name": "echo", "arguments": {"text": "hi"}}</tool_call>', "echo", {"text": "hi"}),
    ('Let me call it.\n<tool_call>\n{"name": "echo", "arguments": {"text": "a", "n": 2}}\n</tool_call>', "echo",
     {"text": "a", "n": 2}),
    ('<tool_call>{"name": "echo", "arguments": "{\\"text\\": \\"s\\"}"}</tool_call>', "echo", {"text": "s"}),  # OpenAI
    ('<tool_call>{"name": "echo"}</tool_call>', "echo", {}),
    ('<tool_call>{"name": "x", "arguments": {}}</tool_call> then <tool_call>{"name": "echo", "arguments": {}}'
     '</tool_call>', "echo", {}),  # the last call of the turn
])
def test_good_calls_parse(turn, name, args):
    call = parse_call(turn)
    assert call == ToolCall(name, args) and call.error is None


@pytest.mark.parametrize("turn, why", [
    ('<tool_call>{"name": "echo", "arguments": {"text": "hi"}', "not closed"),
    ("<tool_call>{'name': 'echo'}</tool_call>", "not valid JSON"),
    ('<tool_call>["echo"]</tool_call>', 'JSON object with a "name"'),
    ('<tool_call>{"arguments": {}}</tool_call>', 'JSON object with a "name"'),
    ('<tool_call>{"name": "echo", "arguments": [1]}</tool_call>', "arguments must be a JSON object"),
    ('<tool_call>{"name": "echo", "arguments": "not json"}</tool_call>', "arguments must be a JSON object"),
])
def test_malformed_calls_say_why(turn, why):
    call = parse_call(turn)
    assert call is not None and why in call.error


def test_no_call_is_none():
    assert parse_call("#### 42") is None and parse_call("") is None


def test_format_call_round_trips():
    assert parse_call(format_call("echo", {"text": "x", "n": 3})) == ToolCall("echo", {"text": "x", "n": 3})


@pytest.mark.parametrize("args, why", [
    ({}, "missing argument(s): text"),
    ({"text": "a", "x": 1}, "unknown argument(s): x"),
    ({"text": 5}, "'text' must be string"),
    ({"text": "a", "n": True}, "'n' must be integer"),
    ({"text": "a", "n": 2.5}, "'n' must be integer"),
])
def test_arguments_are_checked_against_the_schema(args, why):
    assert why in check_arguments(args, Echo.parameters)
    assert check_arguments({"text": "a", "n": 2.0}, Echo.parameters) is None


def test_the_toolbox_turns_every_failure_into_an_error_message():
    box = Toolbox([Echo()])
    assert isinstance(Echo(), Tool)
    calls = [ToolCall("echo", {"text": "ab", "n": 2}), parse_call("<tool_call>{oops}</tool_call>"),
             ToolCall("ecko", {"text": "a"}), ToolCall("echo", {"txt": "a"}), ToolCall("echo", {"text": "raise"}),
             ToolCall("echo", {"text": "crash"})]
    results = box.run(calls)
    assert [r.error for r in results] == [None, "malformed", "unknown_tool", "bad_arguments", "tool_error", "crash"]
    assert results[0].text == "abab"
    assert results[1].text.startswith("error: the call is not valid JSON")
    assert results[2].text == "error: unknown tool 'ecko'; the tools are echo"
    assert results[3].text == "error: missing argument(s): text"
    assert results[4].text == "error: asked to fail"
    assert results[5].text.startswith("error: the tool crashed (KeyError")


def test_a_hanging_tool_times_out_and_the_others_still_answer():
    box = Toolbox([Echo()])
    began = time.monotonic()
    results = box.run([ToolCall("echo", {"text": "hang"}), ToolCall("echo", {"text": "ok"})])
    assert time.monotonic() - began < 3.0  # timeout_s = 1; the hung thread is left behind, not waited for
    assert results[0].error == "timeout" and "did not answer within 1 s" in results[0].text
    assert results[1].text == "ok"


def test_long_results_are_cut():
    result = Toolbox([Echo()]).run([ToolCall("echo", {"text": "x", "n": 10000})])[0]
    assert result.ok and len(result.text) < 4100 and result.text.endswith("[cut]")


def test_schema_and_fallback_prompt():
    schema = tool_schema(Echo())
    assert schema == {"type": "function", "function": {"name": "echo", "description": Echo.description,
                                                       "parameters": Echo.parameters}}
    text = tools_prompt([schema])
    assert "- echo(text: string, n: integer): Repeats its text n times." in text and "<tool_call>" in text


def test_a_task_naming_unknown_tools_is_one_line():
    class Task:
        tools = ("pyton",)

    with pytest.raises(UserError, match="unknown tool 'pyton'.*Did you mean 'python'"):
        Toolbox.for_task(Task())
    Task.tools = ("calculator", "calculator")
    with pytest.raises(UserError, match="lists a tool twice"):
        Toolbox.for_task(Task())


def test_a_task_builds_its_tools_with_options():
    class Task:
        tools = ("calculator",)
        tool_options = {"calculator": {"max_chars": 5}}

    box = Toolbox.for_task(Task())
    assert box.run([ToolCall("calculator", {"expression": "2*3"})])[0].text == "6"
    assert box.run([ToolCall("calculator", {"expression": "2*3+45"})])[0].text == "error: expression too long"
    Task.tool_options = {"calculator": {"max_char": 5}}
    with pytest.raises(UserError, match="sim.tool_options.calculator.max_char' is not an option"):
        Toolbox.for_task(Task())
