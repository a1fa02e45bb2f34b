"""Parser events -> the parts of OpenAI messages and deltas, and the fields responses share."""

from __future__ import annotations

import time
from collections.abc import Callable

from parsers import (
    ContentDelta,
    Event,
    Message,
    ReasoningDelta,
    ToolArgsDelta,
    ToolCallStart,
    tool_call_id,
)
from render_service.derender.machine import OutputOptions
from render_service.protocol.chat import DeltaFunctionCall, DeltaToolCall, FunctionCall, ToolCall
from render_service.protocol.derender import GenerateChunk
from render_service.protocol.usage import UsageInfo


def now() -> int:
    """``created`` of a response: seconds since the epoch."""
    return int(time.time())


def chunk_usage(prompt_tokens: int | None, chunk: GenerateChunk) -> UsageInfo | None:
    """A stream chunk's usage: the engine's counts, the prompt's as the client gave it."""
    if chunk.usage is None:
        return None
    prompt = prompt_tokens if prompt_tokens is not None else chunk.usage.get("prompt_tokens", 0)
    return UsageInfo.of(prompt or 0, chunk.usage.get("completion_tokens") or 0)


#: A tool call's id from (request id, choice index, call index): the family's format.
CallIds = Callable[[str, int, int], str]


def message_parts(
    answer: Message,
    request_id: str,
    index: int,
    options: OutputOptions,
    call_ids: CallIds = tool_call_id,
) -> tuple[str | None, str | None, list[ToolCall]]:
    """Batch: the normalized answer (`ChatParser.batch_answer`) -> (reasoning, content, calls)."""
    calls = [
        ToolCall(
            id=call_ids(request_id, index, call.index),
            function=FunctionCall(name=call.name, arguments=call.arguments),
        )
        for call in answer.tool_calls
        if options.parallel_tool_calls or call.index == 0
    ]
    thinking = answer.reasoning if options.include_reasoning else None
    return thinking, answer.content, calls


def delta_parts(
    events: list[Event],
    request_id: str,
    index: int,
    options: OutputOptions,
    call_ids: CallIds = tool_call_id,
) -> tuple[str | None, str | None, list[DeltaToolCall]]:
    """Streaming: events -> (reasoning, content, tool_calls) of one delta."""
    reasoning: list[str] = []
    content: list[str] = []
    calls: list[DeltaToolCall] = []
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
                    DeltaToolCall(
                        id=call_ids(request_id, index, event.index),
                        type="function",
                        index=event.index,
                        function=DeltaFunctionCall(name=event.name),
                    )
                )
            elif calls and calls[-1].index == event.index and calls[-1].id is None:
                function = calls[-1].function
                function.arguments = (function.arguments or "") + event.text
            else:
                calls.append(
                    DeltaToolCall(
                        index=event.index, function=DeltaFunctionCall(arguments=event.text)
                    )
                )
    thinking = "".join(reasoning) if reasoning and options.include_reasoning else None
    return thinking, ("".join(content) if content else None), calls
