"""hermes tool calls: vLLM 0.33.0 golden derender cases (qwen2.5-instruct) and unit cases."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from parsers import ParseRequest, ToolCallStart, build_chat_parser
from tests.parsers import _golden as g

PLAIN_LOOKALIKE = (
    "'<tool_call>' typed as plain tokens is content (matched by id); vLLM streaming cuts the "
    "content at the literal"
)
MALFORMED = (
    "malformed arguments stream as written up to where the arguments value closes, whatever "
    "the chunking (vLLM: depends on chunking; batch makes it content)"
)

STREAM: g.Divergences = {
    ("literal_tool_call_in_prose", "one_token"): ("batch", PLAIN_LOOKALIKE),
    ("literal_tool_call_in_prose", "random_1_5"): ("batch", PLAIN_LOOKALIKE),
    ("literal_tool_call_in_prose", "whole"): ("batch", PLAIN_LOOKALIKE),
    ("tool_call_malformed_json", "random_1_5"): ("stream:one_token", MALFORMED),
    ("tool_call_malformed_json", "whole"): ("stream:one_token", MALFORMED),
}
# The batch answer is ChatParser.parse_batch (the documented batch rule); vLLM's batch
# answers for malformed or cut calls, whitespace and forced choices follow from it.
BATCH: g.Divergences = {
    ("stop_string", "batch"): ("prefix", "stop strings are cut by the derender layer"),
}

CASES = g.chat_cases("qwen2.5-instruct")
needs_shared = pytest.mark.skipif(not g.shared_present(), reason="../shared is absent")

TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {}}}]


@needs_shared
@pytest.mark.parametrize("path", CASES, ids=[p.stem for p in CASES])
def test_golden_case(path: Path) -> None:
    g.check_case(path, STREAM, BATCH)


def _parse(text: str, request: ParseRequest) -> g.Message:
    tok = g.tokenizer("qwen2.5-instruct")
    parser = build_chat_parser(None, "hermes", g.facts("qwen2.5-instruct"), request)
    assert parser is not None
    ids = tok.encode(text, add_special_tokens=False).ids
    return g.accumulate(g.run(parser, "qwen2.5-instruct", [], [[i] for i in ids]))


@needs_shared
@pytest.mark.parametrize(
    "arguments",
    [
        '{"q": "a \\"quoted\\" } brace", "n": [1, {"x": null}]}',
        '"already a string"',
        "42",
        "[true, false]",
        '{"emoji": "🦜 naïve 天气", "esc": "\\u00e9\\\\"}',
    ],
)
def test_arguments_pass_through_verbatim(arguments: str) -> None:
    text = f'<tool_call>\n{{"name": "get_weather", "arguments": {arguments}}}\n</tool_call>'
    msg = _parse(text, ParseRequest(tools=TOOLS, enable_auto_tools=True))
    assert msg.calls() == [("get_weather", arguments)]
    json.loads(arguments)  # the oracle: what we forwarded is the model's own JSON value


@needs_shared
def test_arguments_before_name() -> None:
    text = '<tool_call>{"arguments": {"city": "Oslo"}, "name": "get_weather"}</tool_call>'
    msg = _parse(text, ParseRequest(tools=TOOLS, enable_auto_tools=True))
    assert msg.calls() == [("get_weather", '{"city": "Oslo"}')]


@needs_shared
def test_escaped_name_is_decoded() -> None:
    text = '<tool_call>{"name": "get_\\u0077eather", "arguments": {}}</tool_call>'
    msg = _parse(text, ParseRequest(tools=TOOLS, enable_auto_tools=True))
    assert msg.calls() == [("get_weather", "{}")]


@needs_shared
def test_tool_choice_none_keeps_markup_as_content() -> None:
    text = '<tool_call>{"name": "get_weather", "arguments": {}}</tool_call>'
    msg = _parse(text, ParseRequest(tools=TOOLS, tool_choice="none", enable_auto_tools=True))
    assert (msg.content, msg.calls()) == (text, [])


@needs_shared
def test_without_auto_tool_flag_no_parser() -> None:
    assert (
        build_chat_parser(None, "hermes", g.facts("qwen2.5-instruct"), ParseRequest(tools=TOOLS))
        is None
    )


@needs_shared
def test_call_without_name_is_dropped_and_index_not_used() -> None:
    text = (
        '<tool_call>{"oops": 1}</tool_call>'
        '<tool_call>{"name": "get_weather", "arguments": {"a": 1}}</tool_call>'
    )
    tok = g.tokenizer("qwen2.5-instruct")
    parser = build_chat_parser(
        None,
        "hermes",
        g.facts("qwen2.5-instruct"),
        ParseRequest(tools=TOOLS, enable_auto_tools=True),
    )
    assert parser is not None
    ids = tok.encode(text, add_special_tokens=False).ids
    events = g.run(parser, "qwen2.5-instruct", [], [ids])
    assert [e for e in events if isinstance(e, ToolCallStart)] == [ToolCallStart(0, "get_weather")]
