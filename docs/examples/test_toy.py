"""The toy tool family: one call in any chunking, the state between chunks, render changes."""

from __future__ import annotations

import json

import msgspec
import pytest

from parsers import (
    ChatState,
    ContentDelta,
    Event,
    ParseRequest,
    TokenizerFacts,
    ToolArgsDelta,
    ToolCallEnd,
    ToolCallStart,
    build_chat_parser,
)

FACTS = TokenizerFacts.from_added_tokens({"<tool>": 900, "</tool>": 901})
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {}}}]
REQUEST = ParseRequest(tools=TOOLS, enable_auto_tools=True)
# An output as (token id, text) pairs; ordinary text tokens get id 1.
OUTPUT = [
    (1, "Let me check."),
    (900, "<tool>"),
    (1, "get_wea"),
    (1, 'ther\n{"city": '),
    (1, '"Paris"}'),
    (901, "</tool>"),
]


def parse(chunks: list[list[tuple[int, str]]], request: ParseRequest = REQUEST) -> list[Event]:
    """Feed chunks, the state crossing json between them as it crosses the stream state."""
    parser = build_chat_parser(None, "toy", FACTS, request)
    assert parser is not None
    state = parser.start([])
    events: list[Event] = []
    for chunk in chunks:
        state = msgspec.json.decode(msgspec.json.encode(state), type=ChatState)
        ids, text = [i for i, _ in chunk], "".join(t for _, t in chunk)
        state, new = parser.feed(state, ids, text)
        events += new
    state, new = parser.finish(state)
    assert state.tools_emitted == any(isinstance(e, ToolCallStart) for e in events)
    return events + new


def summary(events: list[Event]) -> tuple[str, list[tuple[str, str]], list[int]]:
    """(content, [(name, arguments)], ended calls) of the events."""
    content = "".join(e.text for e in events if isinstance(e, ContentDelta))
    calls = {e.index: (e.name, "") for e in events if isinstance(e, ToolCallStart)}
    for e in events:
        if isinstance(e, ToolArgsDelta):
            calls[e.index] = (calls[e.index][0], calls[e.index][1] + e.text)
    return (
        content,
        [calls[i] for i in sorted(calls)],
        [e.index for e in events if isinstance(e, ToolCallEnd)],
    )


@pytest.mark.parametrize("size", [1, 2, 3, len(OUTPUT)])
def test_a_call_in_any_chunking(size: int) -> None:
    chunks = [OUTPUT[i : i + size] for i in range(0, len(OUTPUT), size)]
    assert summary(parse(chunks)) == (
        "Let me check.",
        [("get_weather", '{"city": "Paris"}')],
        [0],
    )


def test_markers_typed_as_text_are_content() -> None:
    typed = [(1, "Write <tool>x\n{}</tool> to call x.")]
    assert summary(parse([typed])) == ("Write <tool>x\n{}</tool> to call x.", [], [])


def test_tool_choice_none_leaves_the_markup_in_the_content() -> None:
    request = ParseRequest(tools=TOOLS, tool_choice="none", enable_auto_tools=True)
    assert (
        summary(parse([OUTPUT], request))[0]
        == 'Let me check.<tool>get_weather\n{"city": "Paris"}</tool>'
    )


def test_render_keeps_special_tokens_and_adds_the_structural_tag() -> None:
    request = ParseRequest(tools=TOOLS, tool_choice="required", enable_auto_tools=True)
    parser = build_chat_parser(None, "toy", FACTS, request)
    assert parser is not None
    adjustments = parser.render_adjustments()
    assert adjustments.skip_special_tokens is False
    assert adjustments.structural_tag is not None
    tags = json.loads(adjustments.structural_tag)["format"]["tags"]
    assert [(t["begin"], t["end"]) for t in tags] == [("<tool>get_weather\n", "</tool>")]
