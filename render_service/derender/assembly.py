"""Parser events -> the parts of OpenAI messages and deltas, and the shared response fields."""

from __future__ import annotations

import time
from typing import Any

from parsers import (
    ContentDelta,
    Event,
    ReasoningDelta,
    ToolArgsDelta,
    ToolCallStart,
    tool_call_id,
)
from render_service.derender.machine import OutputOptions


def now() -> int:
    return int(time.time())


def make_usage(prompt_tokens: int, completion_tokens: int) -> dict[str, Any]:
    return {
        "prompt_tokens": prompt_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "completion_tokens": completion_tokens,
        "prompt_tokens_details": None,
        "completion_tokens_details": None,
    }


def message_parts(
    events: list[Event], request_id: str, index: int, options: OutputOptions
) -> tuple[str | None, str | None, list[dict[str, Any]]]:
    """Batch: events -> (reasoning, content, tool_calls) of one message."""
    reasoning: list[str] = []
    content: list[str] = []
    names: dict[int, str] = {}
    arguments: dict[int, list[str]] = {}
    for event in events:
        if isinstance(event, ReasoningDelta):
            reasoning.append(event.text)
        elif isinstance(event, ContentDelta):
            content.append(event.text)
        elif isinstance(event, ToolCallStart):
            names[event.index] = event.name
            arguments.setdefault(event.index, [])
        elif isinstance(event, ToolArgsDelta):
            arguments.setdefault(event.index, []).append(event.text)
    calls = [
        {
            "id": tool_call_id(request_id, index, tool_index),
            "type": "function",
            "function": {
                "name": names[tool_index],
                "arguments": "".join(arguments.get(tool_index, [])),
            },
        }
        for tool_index in sorted(names)
        if options.parallel_tool_calls or tool_index == 0
    ]
    text: str | None = "".join(content) if content else None
    if text is None and options.forced_tools:
        text = ""
    thinking = "".join(reasoning) if reasoning and options.include_reasoning else None
    return thinking, text, calls


def delta_parts(
    events: list[Event], request_id: str, index: int, options: OutputOptions
) -> tuple[str | None, str | None, list[dict[str, Any]]]:
    """Streaming: events -> (reasoning, content, tool_calls) of one delta."""
    reasoning: list[str] = []
    content: list[str] = []
    calls: list[dict[str, Any]] = []
    for event in events:
        if isinstance(event, ReasoningDelta):
            reasoning.append(event.text)
        elif isinstance(event, ContentDelta):
            content.append(event.text)
        elif isinstance(event, (ToolCallStart, ToolArgsDelta)):
            if not options.parallel_tool_calls and event.index != 0:
                continue
            if isinstance(event, ToolCallStart):
                calls.append(
                    {
                        "id": tool_call_id(request_id, index, event.index),
                        "type": "function",
                        "index": event.index,
                        "function": {"name": event.name, "arguments": None},
                    }
                )
            elif calls and calls[-1]["index"] == event.index and calls[-1]["id"] is None:
                calls[-1]["function"]["arguments"] += event.text
            else:
                calls.append(
                    {
                        "id": None,
                        "type": None,
                        "index": event.index,
                        "function": {"name": None, "arguments": event.text},
                    }
                )
    thinking = "".join(reasoning) if reasoning and options.include_reasoning else None
    return thinking, ("".join(content) if content else None), calls
