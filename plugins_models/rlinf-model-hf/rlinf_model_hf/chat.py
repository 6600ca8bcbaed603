"""Prompts and tool turns as token ids: through the tokenizer's chat template where it has one,
with the tools in it where it renders them, else in rlinf's fallback text format.

- A template that renders ``tools=`` (Qwen2.5, Hermes, ...) describes the tools itself, and its
  ``tool`` role carries results.
- A template that ignores ``tools=`` (SmolLM2's plain ChatML) gets the fallback description of the
  tools (:func:`rlinf_cli.api.toolcalls.tools_prompt`) in the system message, and results wrapped
  in ``<tool_response>`` as a ``tool`` message (a ``user`` one where the template drops tool
  messages).
- No template (the tiny preset's character tokenizer): the description before the prompt and
  ``\\n<tool_response>RESULT</tool_response>\\n`` after the call, as plain text.

A tool turn's tokens are what the template puts between the model's turn and its next one: the
end of the assistant turn (unless the model's own eos ended it), the tool message and the next
assistant header. Tool output is tokenized with special tokens split, so a result that prints
``<|im_end|>`` cannot forge a turn.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from rlinf_cli.api import toolcalls

# placeholders rendered through the template and found again in its output
_CALL, _RESULT, _PROBE = "RLINF_CALL_7f3a", "RLINF_RESULT_7f3a", "rlinf_probe_tool_7f3a"


class ChatFormat:
    """How one tokenizer renders prompts and tool turns (``chat``: use its chat template)."""

    def __init__(self, tokenizer: Any, chat: bool, system_prompt: str | None = None):
        self.tok, self.chat, self.system_prompt = tokenizer, chat, system_prompt
        self.renders_tools = chat and _renders(tokenizer, [{"role": "user", "content": "x"}], _PROBE,
                                               tools=[_probe_schema()])
        self.renders_tool_role = chat and _renders(tokenizer, [{"role": "user", "content": "x"},
                                                               {"role": "assistant", "content": _CALL},
                                                               {"role": "tool", "content": _RESULT}], _RESULT)
        self._turn_texts: dict[str, tuple[str, str]] = {}  # tool name -> the template's text around a result

    def encode_prompt(self, prompt: str, tools: Sequence[Mapping[str, Any]] | None = None) -> list[int]:
        tok = self.tok
        if not self.chat:
            text = f"{toolcalls.tools_prompt(tools)}\n\n{prompt}" if tools else prompt
            bos = [tok.bos_token_id] if tok.bos_token_id is not None else []
            return bos + list(tok.encode(text, add_special_tokens=False))
        system = self.system_prompt
        if tools and not self.renders_tools:
            system = f"{system}\n\n{toolcalls.tools_prompt(tools)}" if system else toolcalls.tools_prompt(tools)
        msgs = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": prompt}]
        extra = {"tools": list(tools)} if tools and self.renders_tools else {}
        ids = tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=True, **extra)
        return list(ids["input_ids"] if isinstance(ids, Mapping) else ids)

    def encode_tool_result(self, name: str, content: str, after_eos: bool = False) -> list[int]:
        """The tokens after a model turn that called ``name``, carrying its result ``content``."""
        if not self.chat:
            return list(self.tok.encode(toolcalls.result_text(content), add_special_tokens=False))
        if name not in self._turn_texts:
            self._turn_texts[name] = self._turn_text(name)
        head, tail = self._turn_texts[name]
        eos = self.tok.eos_token or ""
        if after_eos and eos and head.startswith(eos):
            head = head[len(eos):]
        body = content if self.renders_tools else toolcalls.result_text(content).strip("\n")
        return (self._encode(head) + list(self.tok.encode(body, add_special_tokens=False, split_special_tokens=True))
                + self._encode(tail))

    def _turn_text(self, name: str) -> tuple[str, str]:
        """The template's text around a tool result: (before it, after it), after the call's turn."""
        msg = {"role": "tool", "name": name, "content": _RESULT}
        if not self.renders_tool_role:
            msg = {"role": "user", "content": _RESULT}
        msgs = [{"role": "user", "content": "x"}, {"role": "assistant", "content": _CALL}, msg]
        extra = {"tools": [_probe_schema(name)]} if self.renders_tools else {}
        text = self.tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False, **extra)
        after_call = text[text.index(_CALL) + len(_CALL):]
        head, _, tail = after_call.partition(_RESULT)
        return head, tail

    def _encode(self, text: str) -> list[int]:
        return list(self.tok.encode(text, add_special_tokens=False)) if text else []


def _probe_schema(name: str = _PROBE) -> dict[str, Any]:
    return {"type": "function", "function": {"name": name, "description": "probe",
                                             "parameters": {"type": "object", "properties": {}}}}


def _renders(tok: Any, messages: list[dict[str, Any]], mark: str, **extra: Any) -> bool:
    """Whether the template shows ``mark`` when rendering ``messages`` (a template that raises on
    what it does not support counts as not rendering it)."""
    try:
        text = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False, **extra)
    except Exception:  # jinja errors (raise_exception in the template), TypeError, ...
        return False
    return isinstance(text, str) and mark in text
