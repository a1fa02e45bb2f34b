"""Harmony render for gpt-oss: a chat conversation to prompt ids, as vLLM 0.33.0 renders it.

vLLM renders gpt-oss chats with the Harmony encoding of the `oss-harmony` package (module
`openai_harmony`), not with the model's Jinja template; so do we (`model.harmony`).

`render_harmony` is the whole conversion: chat messages, tools and a reasoning effort in, prompt
ids out (system message with the model identity, knowledge cutoff, date and effort; developer
instructions and tools as a TypeScript-like namespace; history with tool calls and results;
the prompt ends with ``<|start|>assistant``). Other request kinds (Anthropic Messages, Responses)
convert to chat messages and call it.
"""

from __future__ import annotations

import datetime
from collections.abc import Sequence
from typing import Any

from render_service.errors import InvalidRequest, invalid_param
from render_service.model.harmony import HarmonyEncoder

__all__ = ["REASONING_EFFORTS", "render_harmony"]

#: Efforts Harmony can write into the system message.
REASONING_EFFORTS = ("high", "medium", "low")


def render_harmony(
    encoder: HarmonyEncoder,
    messages: Sequence[dict[str, Any]],
    *,
    tools: Sequence[dict[str, Any]] | None = None,
    reasoning_effort: str | None = None,
    start_date: str | None = None,
) -> list[int]:
    """Prompt ids of a chat conversation, ending with ``<|start|>assistant``.

    `messages` are OpenAI chat messages (dicts); a leading system or developer message becomes
    the developer instructions. `tools` are OpenAI function tools (None: no tools section).
    `reasoning_effort` is "low", "medium" or "high" (None: Harmony's default, medium); anything
    else is a 400. `start_date` is the date written as "Current date" (None: today).
    """
    lib = encoder.lib
    if reasoning_effort == "none":
        raise invalid_param(
            f"Harmony does not support reasoning_effort={reasoning_effort!r}", "reasoning_effort"
        )
    if reasoning_effort is not None and reasoning_effort not in REASONING_EFFORTS:
        raise invalid_param(
            f"reasoning_effort={reasoning_effort!r} is not supported by Harmony. Supported "
            f"values are: {', '.join(REASONING_EFFORTS)}.",
            "reasoning_effort",
        )
    chat = list(messages)
    instructions: str | None = None
    if chat and chat[0].get("role") in ("system", "developer"):
        instructions = _flatten(chat.pop(0).get("content"))
    system = lib.SystemContent.new().with_conversation_start_date(
        start_date or datetime.datetime.now().strftime("%Y-%m-%d")
    )
    if reasoning_effort is not None:
        system = system.with_reasoning_effort(lib.ReasoningEffort(reasoning_effort.capitalize()))
    harmony_messages = [lib.Message.from_role_and_content(lib.Role.SYSTEM, system)]
    if instructions or tools:
        harmony_messages.append(_developer(lib, instructions, tools))
    names = {
        call.get("id"): (call.get("function") or {}).get("name")
        for message in chat
        for call in message.get("tool_calls") or []
    }
    try:
        for message in chat:
            harmony_messages.extend(_convert(lib, message, names))
    except ValueError as exc:  # pydantic's ValidationError, e.g. an unknown role
        raise InvalidRequest(str(exc)) from exc
    ids = encoder.encoding.render_conversation_for_completion(
        lib.Conversation.from_messages(_drop_old_analysis(harmony_messages)),
        lib.Role.ASSISTANT,
        config=lib.RenderConversationConfig(auto_drop_analysis=False),
    )
    return _legacy_tool_call_headers(encoder, list(ids))


def _flatten(content: Any) -> str | None:
    """Text of a content field: a string, or the text parts of a list joined without separator."""
    if content is None or isinstance(content, str):
        return content
    if not isinstance(content, list):
        return None
    texts = [
        part if isinstance(part, str) else part.get("text")
        for part in content
        if isinstance(part, (str, dict))
    ]
    kept = [text for text in texts if text is not None]
    return "".join(kept) if kept else None


def _developer(lib: Any, instructions: str | None, tools: Sequence[dict[str, Any]] | None) -> Any:
    content = lib.DeveloperContent.new()
    if instructions is not None:
        content = content.with_instructions(instructions)
    functions = []
    for tool in tools or ():
        if tool.get("type", "function") != "function":
            raise invalid_param(f"tool type {tool.get('type')!r} is not supported.", "tools")
        function = tool.get("function") or {}
        functions.append(
            lib.ToolDescription.new(
                name=function.get("name"),
                description=function.get("description") or "",
                parameters=function.get("parameters"),
            )
        )
    if functions:
        content = content.with_function_tools(functions)
    return lib.Message.from_role_and_content(lib.Role.DEVELOPER, content)


def _assistant(lib: Any, text: str, channel: str) -> Any:
    return lib.Message.from_role_and_content(lib.Role.ASSISTANT, text).with_channel(channel)


def _convert(lib: Any, message: dict[str, Any], names: dict[Any, Any]) -> list[Any]:
    """One chat message as Harmony messages (vLLM's chat-to-Harmony mapping)."""
    role = message.get("role")
    calls = message.get("tool_calls") or []
    if role == "assistant" and calls:
        out = []
        content = _flatten(message.get("content"))
        if content:
            out.append(_assistant(lib, content, "commentary"))
        if message.get("reasoning"):
            out.append(_assistant(lib, message["reasoning"], "analysis"))
        for call in calls:
            function = call.get("function") or {}
            out.append(
                _assistant(lib, function.get("arguments") or "", "commentary")
                .with_recipient(f"functions.{function.get('name', '')}")
                .with_content_type("json")
            )
        return out
    if role == "tool":
        name = names.get(message.get("tool_call_id", "")) or ""
        author = lib.Author.new(lib.Role.TOOL, f"functions.{name}")
        text = _flatten(message.get("content")) or ""
        return [
            lib.Message.from_author_and_content(author, text)
            .with_channel("commentary")
            .with_recipient("assistant")
        ]
    out = []
    if role == "assistant" and message.get("reasoning"):
        out.append(_assistant(lib, message["reasoning"], "analysis"))
    content = message.get("content") or ""
    if isinstance(content, str):
        texts = [content]
    else:
        texts = [part.get("text", "") if isinstance(part, dict) else "" for part in content]
    if role == "assistant":
        if texts and texts[0]:
            contents = [lib.TextContent(text=text) for text in texts]
            out.append(lib.Message.from_role_and_contents(role, contents).with_channel("final"))
    elif role in ("system", "developer"):
        instructions = _flatten(message.get("content"))
        if instructions is not None:
            out.append(_developer(lib, instructions, None))
    else:
        contents = [lib.TextContent(text=text) for text in texts]
        out.append(lib.Message.from_role_and_contents(role, contents))
    return out


def _drop_old_analysis(messages: list[Any]) -> list[Any]:
    """Reasoning before the last final answer is dropped: the model saw it in earlier turns."""
    last_final = -1
    for index, message in enumerate(messages):
        if message.author.role == "assistant" and message.channel == "final":
            last_final = index
    return [
        message
        for index, message in enumerate(messages)
        if not (index < last_final and message.channel == "analysis")
    ]


def _legacy_tool_call_headers(encoder: HarmonyEncoder, ids: list[int]) -> list[int]:
    """Write history tool calls as ``assistant to=R<|channel|>C TYPE`` (the header gpt-oss knows).

    oss-harmony 0.0.10+ renders ``assistant<|channel|>C to=R <|constrain|>TYPE``, which gpt-oss
    may echo with the recipient twice; vLLM 0.33 turns that header back into the older shape,
    so the prompt ids only match with the same rewrite.
    """
    start = encoder.special("<|start|>")
    message = encoder.special("<|message|>")
    out: list[int] = []
    at = 0
    while at < len(ids):
        end = _find(ids, message, at + 1) if ids[at] == start else -1
        if end < 0:
            out.append(ids[at])
            at += 1
            continue
        header = ids[at + 1 : end]
        legacy = _legacy_header(encoder, header)
        out.append(start)
        out.extend(header if legacy is None else legacy)
        out.append(message)
        at = end + 1
    return out


def _find(ids: list[int], token: int, at: int) -> int:
    try:
        return ids.index(token, at)
    except ValueError:
        return -1


def _legacy_header(encoder: HarmonyEncoder, header: list[int]) -> list[int] | None:
    """``assistant<|channel|>C to=R <|constrain|>T`` as ``assistant to=R<|channel|>C T``, else None."""
    channel = encoder.special("<|channel|>")
    constrain = encoder.special("<|constrain|>")
    if channel not in header:
        return None
    at_channel = header.index(channel)
    if constrain not in header[at_channel + 1 :]:
        return None
    at_constrain = header.index(constrain, at_channel + 1)
    decode = encoder.encoding.decode
    author = decode(header[:at_channel])
    middle = decode(header[at_channel + 1 : at_constrain])
    content_type = decode(header[at_constrain + 1 :])
    if author != "assistant" or not middle.endswith(" ") or " to=" not in middle:
        return None
    channel_name, _, recipient = middle[:-1].partition(" to=")
    if not (channel_name and recipient and content_type):
        return None
    return [
        *encoder.encode(f"assistant to={recipient}"),
        channel,
        *encoder.encode(f"{channel_name} {content_type}"),
    ]
