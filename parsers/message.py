"""The batch answer: one documented normalization of the accumulated stream.

Streaming derender sends what the parser's events say, the same for every chunking. A batch
(non-streaming) answer is that stream accumulated the way a client accumulates it (`accumulate`)
and then normalized by `batch_message`, so batch is the same for every chunking too, and equals
vLLM 0.33's batch answer where vLLM's batch differs from its stream only in presentation. The
rules, in order (docs/compat.md, "The batch answer"):

0. **Whitespace before a start marker** (DeepSeek-R1's `"\n<think>reasoning"`): whitespace-only
   reasoning before a `<think>` that the reasoning absorbed is not reasoning.
1. **Calls that are not complete**: arguments that are not JSON (a call cut by max_tokens or
   a stop string, malformed JSON), or markup the family saw never close (`ToolCallEnd.complete`).
   Families whose vLLM batch path takes arguments as text (`validates_arguments` false:
   deepseek_v31) keep every call whose markup closed, arguments as written, and drop the others. `engine` families (vLLM's parser engine: qwen3_coder, ...) keep the call with
   its complete members only (`{"a": 1, "b": "tex` becomes `{"a": 1}`, nothing complete `{}`).
   Other families answer with no calls and the answer as the model wrote it, markup included
   (`as_written`: the same output parsed with tool calling off); their complete calls' arguments
   are written as vLLM's legacy batch path writes them (`json.dumps` of the parsed value, where
   the stream forwards them as the model wrote them).
2. **Content beside calls.** With calls, content that is only whitespace is null; `engine`
   families also strip the whitespace around content.
3. **Forced tool choice** (`required` or a named tool): a null content is `""`.
4. **No content and no calls.** Other than `engine` families (which keep null), the content is
   the answer as the model wrote it (a JSON object the stream dropped for having no name; not
   for families that take arguments as text, which keep null), or `""` when nothing was written
   and there is no reasoning family (vLLM's legacy batch path).

Only whitespace is ever removed from content (rules 2 and 4); text the model wrote stays.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable

import msgspec

from parsers.events import (
    ContentDelta,
    Event,
    ReasoningDelta,
    ToolArgsDelta,
    ToolCallEnd,
    ToolCallStart,
)

__all__ = ["Message", "ToolCall", "accumulate", "batch_message", "complete_members"]


class ToolCall(msgspec.Struct, frozen=True, gc=False):
    """One call as a client accumulates it: the name and the joined argument text."""

    index: int
    name: str
    arguments: str
    #: The family saw the call's markup close (see `ToolCallEnd.complete`).
    complete: bool = True


class Message(msgspec.Struct, frozen=True):
    """Reasoning, content and calls of one answer (None: nothing of that kind arrived)."""

    reasoning: str | None = None
    content: str | None = None
    tool_calls: tuple[ToolCall, ...] = ()


def accumulate(events: Iterable[Event]) -> Message:
    """The events joined as a client joins streamed deltas."""
    reasoning: list[str] = []
    content: list[str] = []
    names: dict[int, str] = {}
    arguments: dict[int, list[str]] = {}
    incomplete: set[int] = set()
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
        elif isinstance(event, ToolCallEnd) and not event.complete:
            incomplete.add(event.index)
    calls = tuple(
        ToolCall(index, names[index], "".join(arguments.get(index, [])), index not in incomplete)
        for index in sorted(names)
    )
    return Message(
        reasoning="".join(reasoning) if reasoning else None,
        content="".join(content) if content else None,
        tool_calls=calls,
    )


def batch_message(
    streamed: Message,
    *,
    engine: bool,
    forced_tool_choice: bool,
    reasoning_family: bool,
    as_written: Callable[[], Message],
    reasoning_lead: int = 0,
    validates_arguments: bool = True,
) -> Message:
    """The batch answer for an accumulated stream (the rules in this module's docstring).

    `as_written` gives the same output parsed with tool calling off; `reasoning_lead` is the
    length of whitespace-only reasoning before a start marker the family drops it for (rule 0);
    `validates_arguments` is False for families whose vLLM batch path takes arguments as text.
    """
    message = streamed
    if reasoning_lead and message.reasoning is not None:
        message = msgspec.structs.replace(message, reasoning=message.reasoning[reasoning_lead:])
    calls = message.tool_calls
    if engine:
        calls = tuple(
            c if _is_json(c.arguments) else _with(c, complete_members(c.arguments)) for c in calls
        )
    elif not validates_arguments:
        calls = tuple(c for c in calls if c.complete)
    elif all(c.complete and _is_json(c.arguments) for c in calls):
        calls = tuple(_with(c, _redumped(c.arguments)) for c in calls)
    else:
        message, calls = as_written(), ()
    content = message.content
    if calls and content is not None:
        content = content.strip() if engine else content
        if not content.strip():
            content = None
    if content is None and forced_tool_choice:
        content = ""
    if content is None and not calls and not engine:
        written = as_written()
        if validates_arguments:
            content = written.content
        if content is None and not reasoning_family and written.content is None:
            content = ""  # nothing was written at all
    return msgspec.structs.replace(message, content=content, tool_calls=calls)


def _with(call: ToolCall, arguments: str) -> ToolCall:
    return msgspec.structs.replace(call, arguments=arguments)


def complete_members(arguments: str) -> str:
    """A JSON object's text cut back to its complete top-level members, closed (`{}` if none)."""
    cuts = [len(arguments)]
    depth = 0
    in_string = escaped = False
    for at, char in enumerate(arguments):
        if in_string:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == '"':
                in_string = False
        elif char == '"':
            in_string = True
        elif char in "{[":
            depth += 1
        elif char in "}]":
            depth -= 1
        elif char == "," and depth == 1:
            cuts.append(at)
    for cut in sorted(cuts, reverse=True):
        candidate = arguments[:cut] + "}"
        if candidate.startswith("{") and _is_json(candidate):
            return candidate
    return "{}"


def _redumped(arguments: str) -> str:
    """Arguments as vLLM's legacy batch path writes them: `json.dumps` of the parsed value."""
    try:
        return json.dumps(json.loads(arguments), ensure_ascii=False)
    except (ValueError, RecursionError):
        return arguments


def _is_json(text: str) -> bool:
    try:
        msgspec.json.decode(text)
    except msgspec.DecodeError:
        return False
    return True
