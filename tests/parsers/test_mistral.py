"""The mistral family: `[TOOL_CALLS]` + a JSON call list, through the chat machine.

Split invariance and the state bound run on text chunks with the real `[TOOL_CALLS]` id; the
golden table (../shared) runs vLLM 0.33.0's stored outputs, token by token, with tekken.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from itertools import pairwise
from pathlib import Path
from typing import Any

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from parsers import (
    ChatState,
    Event,
    ParseRequest,
    TokenizerFacts,
    build_chat_parser,
)
from parsers.tools.mistral import mistral_call_id
from tests.parsers._calls import outcome

TOOL_CALLS = 9
FACTS = TokenizerFacts.from_added_tokens({"[TOOL_CALLS]": TOOL_CALLS, "</s>": 2}, [2, TOOL_CALLS])
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        },
    },
    {"type": "function", "function": {"name": "get_time"}},
]
GOLDEN = Path(__file__).resolve().parents[2].parent / "shared" / "golden" / "mistral"
MODEL = GOLDEN.parent.parent / "models" / "mistral"
STATE = msgspec.json.Decoder(ChatState)


def parse(pieces: Sequence[tuple[list[int], str]], **request: Any) -> list[Event]:
    """Feed (ids, text) chunks through a JSON round trip of the state at every boundary."""
    fields: dict[str, Any] = {"tools": TOOLS, "enable_auto_tools": True, **request}
    parser = build_chat_parser(None, "mistral", FACTS, ParseRequest(**fields))
    assert parser is not None
    state = parser.start([1, 3, 4])
    events: list[Event] = []
    for ids, text in pieces:
        state = STATE.decode(msgspec.json.encode(state))
        state, more = parser.feed(state, ids, text)
        events += more
    return events + parser.finish(state)[1]


def marked(before: str, after: str) -> list[tuple[list[int], str]]:
    """`before`, then `[TOOL_CALLS]`, then `after`, as three chunks."""
    return [([100], before), ([TOOL_CALLS], "[TOOL_CALLS]"), ([101], after)]


CALL = '[{"name": "get_weather", "arguments": {"city": "Paris"}}]'
CASES: list[tuple[str, list[tuple[list[int], str]], dict[str, Any], Any]] = [
    ("single", marked("", CALL), {}, ([("get_weather", '{"city": "Paris"}')], None)),
    ("content_before", marked("Let me check. ", CALL), {}, ([("get_weather", '{"city": "Paris"}')], "Let me check. ")),
    (
        "two_calls_name_after_arguments",
        marked("", '[{"name": "get_time", "arguments": {}}, {"arguments": {"city": "Oslo"}, "name": "get_weather", "id": "x"}]'),
        {},
        ([("get_time", "{}"), ("get_weather", '{"city": "Oslo"}')], None),
    ),
    ("lone_object", marked("", '{"name": "get_time", "arguments": {}}'), {}, ([("get_time", "{}")], None)),
    ("text_after_list", marked("", CALL + " Done."), {}, ([("get_weather", '{"city": "Paris"}')], " Done.")),
    ("malformed", marked("", '[{"name": "get_weather", "arguments": {"city": "Paris",, }]'), {}, ([("get_weather", '{"city": "Paris",, }')], None)),
    ("truncated", marked("", '[{"name": "get_weather", "arguments": {"city": "Pa'), {}, ([("get_weather", '{"city": "Pa')], None)),
    ("not_a_call_object", marked("", '[{"city": "Paris"}]'), {}, ([], '[{"city": "Paris"}]')),
    ("tool_choice_none", marked("", CALL), {"tool_choice": "none"}, ([], "[TOOL_CALLS]" + CALL)),
    ("no_tools", marked("", CALL), {"tools": None}, ([], "[TOOL_CALLS]" + CALL)),
    ("required_bare_list", [([100], CALL)], {"tool_choice": "required"}, ([("get_weather", '{"city": "Paris"}')], None)),
    ("named_bare_arguments", [([100], '{"city": "Paris"}')], {"tool_choice": {"type": "function", "function": {"name": "get_weather"}}}, ([], '{"city": "Paris"}')),
    ("auto_bare_list_is_content", [([100], CALL)], {}, ([], CALL)),
]  # fmt: skip


@pytest.mark.parametrize(
    ("pieces", "request_fields", "expected"),
    [pytest.param(p, r, e, id=name) for name, p, r, e in CASES],
)
def test_cases(
    pieces: list[tuple[list[int], str]], request_fields: dict[str, Any], expected: Any
) -> None:
    assert outcome(parse(pieces, **request_fields)) == expected


def _per_char(pieces: list[tuple[list[int], str]]) -> list[tuple[list[int], str]]:
    out: list[tuple[list[int], str]] = []
    for ids, text in pieces:
        if ids == [TOOL_CALLS]:
            out.append((ids, text))
        else:
            out += [([100], c) for c in text]
    return out


@pytest.mark.parametrize(
    ("pieces", "request_fields"), [pytest.param(p, r, id=n) for n, p, r, _ in CASES]
)
@settings(max_examples=25, deadline=None)
@given(points=st.lists(st.integers(min_value=0, max_value=300), max_size=10))
def test_split_invariance(
    pieces: list[tuple[list[int], str]], request_fields: dict[str, Any], points: list[int]
) -> None:
    whole = outcome(parse(pieces, **request_fields))
    assert outcome(parse(_per_char(pieces), **request_fields)) == whole
    chunks: list[tuple[list[int], str]] = []
    for ids, text in pieces:
        if ids == [TOOL_CALLS]:
            chunks.append((ids, text))
            continue
        bounds = sorted({p % (len(text) + 1) for p in points} | {0, len(text)})
        chunks += [([100], text[a:b]) for a, b in pairwise(bounds)]
    assert outcome(parse(chunks, **request_fields)) == whole


def test_state_stays_small_after_10k_chunks() -> None:
    parser = build_chat_parser(
        None, "mistral", FACTS, ParseRequest(tools=TOOLS, enable_auto_tools=True)
    )
    assert parser is not None
    state = parser.start([])
    state, _ = parser.feed(state, [TOOL_CALLS], "[TOOL_CALLS]")
    state, _ = parser.feed(state, [100], '[{"name": "get_weather", "arguments": {"city": "')
    largest = 0
    for _ in range(10_000):
        state, _ = parser.feed(state, [101], " word")
        largest = max(largest, len(msgspec.json.encode(state)), len(msgspec.msgpack.encode(state)))
    assert largest < 1024


def test_call_ids_are_nine_alphanumerics_and_deterministic() -> None:
    first = mistral_call_id("chatcmpl-x", 0, 0)
    assert re.fullmatch(r"[A-Za-z0-9]{9}", first)
    assert first == mistral_call_id("chatcmpl-x", 0, 0)
    assert first not in {mistral_call_id("chatcmpl-x", 0, 1), mistral_call_id("chatcmpl-x", 1, 0)}
    parser = build_chat_parser(
        None, "mistral", FACTS, ParseRequest(tools=TOOLS, enable_auto_tools=True)
    )
    assert parser is not None and parser.tool_call_id("chatcmpl-x", 0, 0) == first


@pytest.mark.skipif(not GOLDEN.is_dir(), reason="../shared/golden/mistral is absent")
@pytest.mark.parametrize("name", ["tools_required", "tools_named", "tools_strict_and_no_params"])
def test_render_adjustments_match_vllm(name: str) -> None:
    case = json.loads((GOLDEN / "render" / f"{name}.json").read_text(encoding="utf-8"))
    request = case["request"]
    parse_request = ParseRequest(
        tools=request.get("tools"), tool_choice=request.get("tool_choice"), enable_auto_tools=True
    )
    parser = build_chat_parser(None, "mistral", FACTS, parse_request)
    assert parser is not None
    adjustments = parser.render_adjustments()
    sampling = case["response"]["sampling_params"]
    assert adjustments.skip_special_tokens is sampling.get("skip_special_tokens")
    structured = sampling.get("structured_outputs")
    assert adjustments.json_schema == (structured["json"] if structured else None)
    assert adjustments.structural_tag is None
