"""The batch rule (`parsers.message.batch_message`): each row names the case it comes from.

Rows are accumulated streams (what our parsers stream for the named golden case or vLLM test)
and the batch answer vLLM 0.33 gives there; the golden tests check the same end to end.
"""

from __future__ import annotations

from typing import Any

import pytest

from parsers.message import Message, ToolCall, batch_message, complete_members

WRITTEN = Message(content="<tool_call>\n{...as the model wrote it")
EMPTY = Message()  # an output with no text: parsed with tools off it is empty too


def msg(content: str | None = None, *calls: Any, reasoning: str | None = None) -> Message:
    tool_calls = tuple(
        ToolCall(i, c[0], c[1], c[2] if len(c) > 2 else True) for i, c in enumerate(calls)
    )
    return Message(reasoning=reasoning, content=content, tool_calls=tool_calls)


# (source, streamed, engine, forced tool choice, reasoning family, reasoning lead, batch answer)
ROWS: list[tuple[str, Message, bool, bool, bool, int, Message]] = [
    (
        "golden qwen3/history_then_tool_call",
        msg("\n\n", ("send_email", '{"to": "a"}'), reasoning="plan"),
        False, False, True, 0,
        msg(None, ("send_email", '{"to": "a"}'), reasoning="plan"),
    ),
    (
        "golden qwen3/tool_choice_named",
        msg("\n\n", ("get_weather", '{"city": "Paris"}'), reasoning="r"),
        False, True, True, 0,
        msg("", ("get_weather", '{"city": "Paris"}'), reasoning="r"),
    ),
    (
        "golden qwen2.5-instruct/content_before_tool_call (legacy: kept as written)",
        msg("Let me check.\n", ("get_weather", '{"city": "Paris"}')),
        False, False, False, 0,
        msg("Let me check.\n", ("get_weather", '{"city": "Paris"}')),
    ),
    (
        "golden qwen3-coder/content_then_two_calls (engine: stripped)",
        msg("Let me do both.\n\n\n", ("a", "{}"), ("b", "{}")),
        True, False, False, 0,
        msg("Let me do both.", ("a", "{}"), ("b", "{}")),
    ),
    (
        "golden qwen3-coder/text_after_tool_call (text kept, stripped)",
        msg("\nDone.", ("get_weather", '{"city": "Paris"}')),
        True, False, False, 0,
        msg("Done.", ("get_weather", '{"city": "Paris"}')),
    ),
    (
        "golden qwen3-coder/truncated_second_call",
        msg(None, ("get_weather", '{"city": "Paris"}'), ("search_web", '{"query": "Par')),
        True, False, False, 0,
        msg(None, ("get_weather", '{"city": "Paris"}'), ("search_web", "{}")),
    ),
    (
        "golden qwen3-coder/truncated_in_parameter_value",
        msg(None, ("write_file", '{"path": "notes.md", "content": "The first par')),
        True, False, False, 0,
        msg(None, ("write_file", '{"path": "notes.md"}')),
    ),
    (
        "golden qwen2.5-instruct/tool_call_malformed_json",
        msg(None, ("get_weather", '{"city": "Paris",, }')),
        False, False, False, 0,
        WRITTEN,
    ),
    (
        "vLLM test_hermes_parser_non_streaming_tool_call_invalid_json (object never closed)",
        msg(None, ("final_answer", '{"trigger": true}', False)),
        False, False, False, 0,
        WRITTEN,
    ),
    (
        "vLLM test_hermes_parser_streaming (legacy batch re-dumps arguments)",
        msg(None, ("get_current_temperature", '{"location":"SF","unit": "c"}')),
        False, False, False, 0,
        msg(None, ("get_current_temperature", '{"location": "SF", "unit": "c"}')),
    ),
    (
        "golden qwen2.5-instruct/only_eos (legacy: '')",
        EMPTY,
        False, False, False, 0,
        msg(""),
    ),
    (
        "golden qwen3-coder/only_eos (engine: null)",
        msg(None),
        True, False, False, 0,
        msg(None),
    ),
    (
        "vLLM test_extract_tool_calls_missing_name_key (llama3_json: dropped object, as written)",
        msg(None),
        False, False, False, 0,
        WRITTEN,
    ),
    (
        "vLLM test_reasoning[new_line] (DeepSeek-R1: '\\n' before <think>)",
        msg("\nThis is the rest", reasoning="\nThis is a reasoning section"),
        False, False, True, 1,
        msg("\nThis is the rest", reasoning="This is a reasoning section"),
    ),
]  # fmt: skip


@pytest.mark.parametrize(
    ("streamed", "engine", "forced", "reasoning_family", "lead", "expected"),
    [pytest.param(*row[1:], id=row[0]) for row in ROWS],
)
def test_batch_rule(
    streamed: Message,
    engine: bool,
    forced: bool,
    reasoning_family: bool,
    lead: int,
    expected: Message,
) -> None:
    got = batch_message(
        streamed,
        engine=engine,
        forced_tool_choice=forced,
        reasoning_family=reasoning_family,
        as_written=lambda: EMPTY if streamed is EMPTY else WRITTEN,
        reasoning_lead=lead,
    )
    assert got == expected


@pytest.mark.parametrize(
    ("arguments", "expected"),
    [
        ('{"a": 1, "b": "te', '{"a": 1}'),
        ('{"a": "x, y", "b": [1, 2', '{"a": "x, y"}'),
        ('{"a": {"k": "v"}, "n": ', '{"a": {"k": "v"}}'),
        ('{"q": "Par', "{}"),
        ("", "{}"),
        ('{"a": 1', '{"a": 1}'),
    ],
)
def test_complete_members(arguments: str, expected: str) -> None:
    assert complete_members(arguments) == expected
