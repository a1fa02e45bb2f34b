"""The Messages and Responses event machines, fed chat deltas cut at every point (no model needed).

Atoms of one answer (reasoning, text, two tool calls) are grouped into chat stream deltas in every
way hypothesis finds; the events each grouping makes, accumulated by the official SDKs, must give
the same message as the batch conversion of the whole answer.
"""

from __future__ import annotations

from itertools import pairwise
from typing import Any

import msgspec
from hypothesis import given, settings
from hypothesis import strategies as st

from render_service.derender import messages as messages_events
from render_service.derender import responses as responses_events
from render_service.protocol.responses import ResponseEcho
from tests.sdk_streams import anthropic_final, like, openai_final

ATOMS: list[tuple[str, Any]] = [
    ("reasoning", "Two "),
    ("reasoning", "cities."),
    ("content", "Checking "),
    ("content", "both."),
    ("start", (0, "w")),
    ("args", (0, '{"city": ')),
    ("args", (0, '"Paris"}')),
    ("start", (1, "w")),
    ("args", (1, '{"city": "Rome"}')),
]
CHAT_ID = "generate-tokens-x"


def deltas(cuts: list[int]) -> list[dict[str, Any]]:
    """The chat deltas of ATOMS cut before each index in ``cuts``."""
    bounds = [0, *sorted(set(cuts)), len(ATOMS)]
    out = []
    for start, end in pairwise(bounds):
        delta: dict[str, Any] = {"reasoning": None, "content": None, "tool_calls": []}
        for kind, value in ATOMS[start:end]:
            if kind in ("reasoning", "content"):
                delta[kind] = (delta[kind] or "") + value
            elif kind == "start":
                index, name = value
                call_id = f"chatcmpl-tool-{index}"
                function = {"name": name, "arguments": None}
                delta["tool_calls"].append({"id": call_id, "index": index, "function": function})
            else:
                index, text = value
                function = {"name": None, "arguments": text}
                delta["tool_calls"].append({"id": None, "index": index, "function": function})
        out.append(delta)
    return out


MESSAGE = {
    "reasoning": "Two cities.",
    "content": "Checking both.",
    "tool_calls": [
        {
            "id": "chatcmpl-tool-0",
            "type": "function",
            "function": {"name": "w", "arguments": '{"city": "Paris"}'},
        },
        {
            "id": "chatcmpl-tool-1",
            "type": "function",
            "function": {"name": "w", "arguments": '{"city": "Rome"}'},
        },
    ],
}


def messages_final(groups: list[dict[str, Any]]) -> dict[str, Any]:
    state = messages_events.MessagesStream(message_id=CHAT_ID, prompt_tokens=7)
    events: list[Any] = []
    for number, delta in enumerate(groups):
        finish = "tool_calls" if number == len(groups) - 1 else None
        state, more = messages_events.step(state, "m", delta, finish, None, 1)
        events.extend(more)
    return anthropic_final(events)


def responses_final(groups: list[dict[str, Any]]) -> dict[str, Any]:
    state = responses_events.ResponsesStream(
        response_id=CHAT_ID, model="m", created_at=1, prompt_tokens=7, echo=ResponseEcho()
    )
    events: list[Any] = []
    for number, delta in enumerate(groups):
        finish = "tool_calls" if number == len(groups) - 1 else None
        state, more = responses_events.step(state, delta, finish, 1, 0)
        events.extend(more)
    return openai_final(events)


def test_messages_batch_shape() -> None:
    chat = {
        "id": CHAT_ID,
        "model": "m",
        "choices": [{"message": MESSAGE, "finish_reason": "tool_calls", "stop_reason": None}],
        "usage": {"prompt_tokens": 7, "completion_tokens": 3},
    }
    message = msgspec.to_builtins(messages_events.message_response(chat))
    assert [block["type"] for block in message["content"]] == [
        "thinking",
        "text",
        "tool_use",
        "tool_use",
    ]
    assert message["stop_reason"] == "tool_use"


@settings(max_examples=60, deadline=None)
@given(cuts=st.lists(st.integers(1, len(ATOMS) - 1), max_size=len(ATOMS)))
def test_every_grouping_accumulates_to_the_batch_message(cuts: list[int]) -> None:
    groups = deltas(cuts)
    chat = {
        "id": CHAT_ID,
        "model": "m",
        "choices": [{"message": MESSAGE, "finish_reason": "tool_calls", "stop_reason": None}],
        "usage": {"prompt_tokens": 7, "completion_tokens": len(groups)},
    }
    want = msgspec.to_builtins(messages_events.message_response(chat))
    got = messages_final(groups)
    assert like(got, want) == want
    items = msgspec.to_builtins(
        responses_events.batch_output(CHAT_ID, MESSAGE, "tool_calls", ResponseEcho())
    )
    final = responses_final(groups)
    assert like(final["output"], items) == items
    assert final["status"] == "completed"
