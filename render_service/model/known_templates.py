"""Plain-Python renderers for known chat templates, equal in output to the templates themselves.

A chat template is recognized by the digest of its exact text (Qwen3's and Qwen2.5's, shared by
every size of those families). Its renderer gives the same prompt text as our Jinja environment
(render_service.model.chat_jinja) for the conversations it covers: messages of plain dicts with
string roles and string content, tool calls as the template reads them, tools as dicts. For
anything else it answers None and the template itself renders, so an error or an odd input
takes the template's own path. tests/test_known_templates.py checks the equality over random
conversations with hypothesis. ``--no-known-chat-templates`` turns the renderers off.

They exist for speed: the template costs ~0.1 ms of a 1k-token render in Jinja, ~10 µs here.
"""

from __future__ import annotations

import hashlib
import json
import sys
from collections.abc import Callable, Mapping
from typing import Any

import msgspec

from render_service.caches import ByteLRU
from render_service.settings import DEFAULTS

__all__ = ["TOOL_BLOCKS", "KnownTemplate", "known_template"]

# The renderer's inputs as chat_jinja.render_chat has them just before Jinja would run:
# messages, tools, add_generation_prompt, the template's other variables; None: not covered.
KnownTemplate = Callable[[list[Any], Any, Any, Mapping[str, Any]], "str | None"]

# Names either template reads from its context (other than messages, tools and
# add_generation_prompt, passed on their own): a template kwarg of any other name is unused.
_READ_KWARGS = frozenset({"enable_thinking"})
# A kwarg or special token of these names would shadow or collide with the template's own
# inputs; the template then decides what happens.
_RESERVED = frozenset({"messages", "tools", "documents", "add_generation_prompt", "namespace"})
_SHADOWING = _RESERVED | _READ_KWARGS


def _tojson(value: Any) -> str:
    """The ``tojson`` filter of chat templates (chat_jinja.tojson with its defaults)."""
    return json.dumps(value, ensure_ascii=False)


def _covered(messages: list[Any]) -> bool:
    """Every message a dict with a string role and string content (what both templates read
    without surprises); reasoning, when given, a string."""
    for message in messages:
        if type(message) is not dict:
            return False
        if type(message.get("role")) is not str or type(message.get("content")) is not str:
            return False
        reasoning = message.get("reasoning_content")
        if reasoning is not None and type(reasoning) is not str:
            return False
    return True


def _tool_call_parts(call: Any, unwrap: Callable[[Any], bool]) -> tuple[str, Any] | None:
    """A tool call's name and arguments as the template reads them (None: not covered)."""
    if type(call) is not dict:
        return None
    if unwrap(call):
        call = call["function"]
        if type(call) is not dict:
            return None
    name = call.get("name")
    if type(name) is not str or "arguments" not in call:
        return None
    return name, call["arguments"]


#: The tools' JSON lines of a prompt, by the msgpack encoding of the tools (a deployment sends
#: the same few tool sets again and again: ~6 µs of json.dumps a tool, ~0.5 µs to encode a key).
#: msgpack tells apart every two values whose JSON differs (1 and 1.0, True and 1, NaN and null).
TOOL_BLOCKS: ByteLRU[bytes, str] = ByteLRU("tool_blocks", DEFAULTS["small_cache_bytes"])
_TOOLS_KEY = msgspec.msgpack.Encoder()
_BLOCK_OVERHEAD = 200  # dict slot, LRU links, tuple, the key's bytes object


def _tools_block(tools: list[Any]) -> str | None:
    if not all(type(tool) is dict for tool in tools):
        return None
    key: bytes | None
    try:
        key = _TOOLS_KEY.encode(tools)
    except (TypeError, ValueError, OverflowError):  # e.g. an int past 64 bits: not kept
        key = None
    cached = TOOL_BLOCKS.get(key) if key is not None else None
    if cached is not None:
        return cached
    block = "".join("\n" + _tojson(tool) for tool in tools)
    if key is not None:
        TOOL_BLOCKS.put(key, block, _BLOCK_OVERHEAD + len(key) + sys.getsizeof(block))
    return block


_TOOLS_INTRO = (
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>"
)
_TOOLS_OUTRO = (
    "\n</tools>\n\nFor each function call, return a json object with function name and "
    "arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n"
    '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call><|im_end|>\n'
)


def _tool_response(messages: list[Any], index: int, content: str) -> str:
    """A tool message: consecutive ones share one user turn (both templates alike)."""
    opens = index == 0 or messages[index - 1]["role"] != "tool"
    closes = index == len(messages) - 1 or messages[index + 1]["role"] != "tool"
    return (
        ("<|im_start|>user" if opens else "")
        + "\n<tool_response>\n"
        + content
        + "\n</tool_response>"
        + ("<|im_end|>\n" if closes else "")
    )


def _qwen3_unwrap(call: dict[str, Any]) -> bool:
    # ``{%- if tool_call.function %}``: a truthy function replaces the call.
    return bool(call.get("function"))


def render_qwen3(
    messages: list[Any], tools: Any, add_generation_prompt: Any, variables: Mapping[str, Any]
) -> str | None:
    """Qwen3's chat template (Qwen3-0.6B ... 235B), or None where it is not covered."""
    if not messages or not _covered(messages) or (tools is not None and type(tools) is not list):
        return None
    out: list[str] = []
    first = messages[0]
    if tools:
        block = _tools_block(tools)
        if block is None:
            return None
        out.append("<|im_start|>system\n")
        if first["role"] == "system":
            out.append(first["content"] + "\n\n")
        out.append(_TOOLS_INTRO + block + _TOOLS_OUTRO)
    elif first["role"] == "system":
        out.append("<|im_start|>system\n" + first["content"] + "<|im_end|>\n")
    # The last user turn that is not a tool response: reasoning is shown only after it.
    last_query = len(messages) - 1
    for index in range(len(messages) - 1, -1, -1):
        message = messages[index]
        text = message["content"]
        if message["role"] == "user" and not (
            text.startswith("<tool_response>") and text.endswith("</tool_response>")
        ):
            last_query = index
            break
    final = len(messages) - 1
    for index, message in enumerate(messages):
        role, content = message["role"], message["content"]
        if role == "user" or (role == "system" and index > 0):
            out.append("<|im_start|>" + role + "\n" + content + "<|im_end|>\n")
        elif role == "assistant":
            reasoning = message.get("reasoning_content")
            if reasoning is None:
                reasoning = ""
                if "</think>" in content:
                    reasoning = (
                        content.split("</think>")[0].rstrip("\n").split("<think>")[-1].lstrip("\n")
                    )
                    content = content.split("</think>")[-1].lstrip("\n")
            if index > last_query and (index == final or reasoning):
                out.append(
                    "<|im_start|>"
                    + role
                    + "\n<think>\n"
                    + reasoning.strip("\n")
                    + "\n</think>\n\n"
                    + content.lstrip("\n")
                )
            else:
                out.append("<|im_start|>" + role + "\n" + content)
            calls = message.get("tool_calls")
            if calls:
                if type(calls) is not list:
                    return None
                for number, call in enumerate(calls):
                    parts = _tool_call_parts(call, _qwen3_unwrap)
                    if parts is None:
                        return None
                    name, arguments = parts
                    if number > 0 or content:
                        out.append("\n")
                    if type(arguments) is not str:
                        arguments = _tojson(arguments)
                    out.append('<tool_call>\n{"name": "' + name + '", "arguments": ' + arguments)
                    out.append("}\n</tool_call>")
            out.append("<|im_end|>\n")
        elif role == "tool":
            out.append(_tool_response(messages, index, content))
    if add_generation_prompt:
        out.append("<|im_start|>assistant\n")
        if variables.get("enable_thinking", True) is False:
            out.append("<think>\n\n</think>\n\n")
    return "".join(out)


def _qwen25_unwrap(call: dict[str, Any]) -> bool:
    # ``{%- if tool_call.function is defined %}``: any function key replaces the call.
    return "function" in call


_QWEN25_SYSTEM = "You are Qwen, created by Alibaba Cloud. You are a helpful assistant."


def render_qwen25(
    messages: list[Any], tools: Any, add_generation_prompt: Any, variables: Mapping[str, Any]
) -> str | None:
    """Qwen2.5's chat template (Qwen2.5-*-Instruct), or None where it is not covered."""
    if not messages or not _covered(messages) or (tools is not None and type(tools) is not list):
        return None
    out: list[str] = []
    first = messages[0]
    system = first["content"] if first["role"] == "system" else _QWEN25_SYSTEM
    if tools:
        block = _tools_block(tools)
        if block is None:
            return None
        out.append("<|im_start|>system\n" + system + "\n\n" + _TOOLS_INTRO + block + _TOOLS_OUTRO)
    else:
        out.append("<|im_start|>system\n" + system + "<|im_end|>\n")
    for index, message in enumerate(messages):
        role, content = message["role"], message["content"]
        calls = message.get("tool_calls")
        if (
            role == "user"
            or (role == "system" and index > 0)
            or (role == "assistant" and not calls)
        ):
            out.append("<|im_start|>" + role + "\n" + content + "<|im_end|>\n")
        elif role == "assistant":
            if type(calls) is not list:
                return None
            out.append("<|im_start|>" + role)
            if content:
                out.append("\n" + content)
            for call in calls:
                parts = _tool_call_parts(call, _qwen25_unwrap)
                if parts is None:
                    return None
                name, arguments = parts
                out.append('\n<tool_call>\n{"name": "' + name + '", "arguments": ')
                out.append(_tojson(arguments) + "}\n</tool_call>")
            out.append("<|im_end|>\n")
        elif role == "tool":
            out.append(_tool_response(messages, index, content))
    if add_generation_prompt:
        out.append("<|im_start|>assistant\n")
    return "".join(out)


def _digest(template: str) -> str:
    return hashlib.sha256(template.encode()).hexdigest()


# sha256 of each template's exact text (the chat_template of the models' tokenizer_config.json).
_KNOWN: dict[str, KnownTemplate] = {
    # Qwen/Qwen3-0.6B (and the other Qwen3 sizes).
    "a55ee1b1660128b7098723e0abcd92caa0788061051c62d51cbe87d9cf1974d8": render_qwen3,
    # Qwen/Qwen2.5-7B-Instruct (and the other Qwen2.5 Instruct sizes).
    "cd8e9439f0570856fd70470bf8889ebd8b5d1107207f67a5efb46e342330527f": render_qwen25,
}


def known_template(template: str | None) -> KnownTemplate | None:
    """The plain-Python renderer of ``template`` when it is one we know exactly, else None."""
    if template is None:
        return None
    return _KNOWN.get(_digest(template))


def usable(kwargs: Mapping[str, Any], special_tokens: Mapping[str, Any]) -> bool:
    """Whether the template's context holds nothing a renderer does not model: every kwarg
    one the templates read, no special token named like one of their inputs."""
    return kwargs.keys() <= _READ_KWARGS and not (special_tokens.keys() & _SHADOWING)
