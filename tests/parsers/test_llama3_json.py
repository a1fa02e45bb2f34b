"""llama3_json tool calls: vLLM 0.33.0 golden derender cases (llama-3.1-instruct) and unit cases."""

from __future__ import annotations

import json
from pathlib import Path

import msgspec
import pytest

from parsers import ParseRequest, ToolCallEnd, ToolCallStart, build_chat_parser
from tests.parsers import _golden as g

MODEL = "llama-3.1-instruct"

WHOLE_CHUNK = (
    "a call that arrives in one chunk is a call (vLLM streaming emits nothing and finish 'stop' "
    "for the whole chunking, but the call for the one-token and random chunkings)"
)
NOT_A_CALL = (
    "an object whose first key is not name/parameters/arguments is content, any chunking "
    "(vLLM batch: content; vLLM streaming: it vanishes)"
)
BARE_ARGS = (
    "bare arguments under a named tool choice are not a call: content, as in vLLM batch "
    "(vLLM streaming: they vanish)"
)

STREAM: g.Divergences = {
    **{
        (case, "whole"): ("stream:one_token", WHOLE_CHUNK)
        for case in (
            "parallel_false_two_calls",
            "tool_call_arguments_key",
            "tool_call_python_tag",
            "tool_choice_named",
            "tool_choice_required",
            "two_calls_semicolon",
        )
    },
    **{
        ("json_answer_not_a_call", chunking): ("batch", NOT_A_CALL)
        for chunking in ("one_token", "random_1_5", "whole")
    },
    **{
        ("tool_choice_named_raw_args", chunking): ("batch", BARE_ARGS)
        for chunking in ("one_token", "random_1_5", "whole")
    },
}
# The batch answer is ChatParser.parse_batch (the documented batch rule), which gives vLLM's
# batch answers for forced choices and empty answers.
BATCH: g.Divergences = {}

CASES = g.chat_cases(MODEL)
needs_shared = pytest.mark.skipif(not g.shared_present(), reason="../shared is absent")

TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {}}}]
AUTO = ParseRequest(tools=TOOLS, enable_auto_tools=True)


@needs_shared
@pytest.mark.parametrize("path", CASES, ids=[p.stem for p in CASES])
def test_golden_case(path: Path) -> None:
    g.check_case(path, STREAM, BATCH)


def _parse(text: str, request: ParseRequest = AUTO, family: str = "llama3_json") -> g.Message:
    """Encode `text` (marker spellings become their tokens) and stream it token by token."""
    tok = g.tokenizer(MODEL)
    parser = build_chat_parser(None, family, g.facts(MODEL), request)
    assert parser is not None
    ids = tok.encode(text, add_special_tokens=False).ids
    return g.accumulate(g.run(parser, MODEL, [], [[i] for i in ids]))


@needs_shared
@pytest.mark.parametrize(
    "arguments",
    [
        '{"q": "a \\"quoted\\" } brace; {", "n": [1, {"x": null}]}',
        '"already a string"',
        "42",
        "[true, false]",
        '{"emoji": "🦜 naïve 天气", "esc": "\\u00e9\\\\"}',
        '{"compact":1,"spaced" :  2}',
    ],
)
def test_arguments_pass_through_verbatim(arguments: str) -> None:
    msg = _parse(f'{{"name": "get_weather", "parameters": {arguments}}}')
    assert (msg.content, msg.calls()) == (None, [("get_weather", arguments)])
    json.loads(arguments)  # the oracle: what we forwarded is the model's own JSON value


@needs_shared
def test_llama4_json_is_the_same_family() -> None:
    text = '{"name": "get_weather", "arguments": {"city": "Oslo"}}'
    assert _parse(text, family="llama4_json").calls() == [("get_weather", '{"city": "Oslo"}')]


@needs_shared
def test_calls_end_with_their_object() -> None:
    text = '<|python_tag|>{"name": "a", "parameters": {}}; {"name": "b", "parameters": {"x": 1}}'
    tok = g.tokenizer(MODEL)
    parser = build_chat_parser(None, "llama3_json", g.facts(MODEL), AUTO)
    assert parser is not None
    events = g.run(parser, MODEL, [], [tok.encode(text, add_special_tokens=False).ids])
    kinds = [(type(e).__name__, getattr(e, "index", None)) for e in events]
    assert kinds == [
        ("ToolCallStart", 0),
        ("ToolArgsDelta", 0),
        ("ToolCallEnd", 0),
        ("ToolCallStart", 1),
        ("ToolArgsDelta", 1),
        ("ToolCallEnd", 1),
    ]


@needs_shared
@pytest.mark.parametrize(
    "text",
    [
        "Paris is the capital.",
        '  {"answer": 42}',
        "{}",
        '{"nam": 1}',
        "<|python_tag|>brave_search.call(query='x')",
        '{"name',  # cut before the first key closed: undecided, released as content
    ],
)
def test_not_a_call_is_content(text: str) -> None:
    msg = _parse(text)
    assert (msg.content, msg.calls()) == (text, [])


@needs_shared
def test_leading_whitespace_before_a_call_is_dropped() -> None:
    msg = _parse('\n {"name": "get_weather", "parameters": {}}')
    assert (msg.content, msg.calls()) == (None, [("get_weather", "{}")])


@needs_shared
@pytest.mark.parametrize("tail", ["; Done.", ' {"answer": 1}', '; {"na', "\n<|python_tag|>"])
def test_what_follows_the_calls_is_dropped(tail: str) -> None:
    """vLLM drops text after the calls in both modes (batch: no `{`; streaming: no JSON)."""
    msg = _parse('{"name": "get_weather", "parameters": {}}' + tail)
    assert (msg.content, msg.calls()) == (None, [("get_weather", "{}")])


@needs_shared
def test_python_tag_typed_as_text_is_content() -> None:
    tok = g.tokenizer(MODEL)
    parser = build_chat_parser(None, "llama3_json", g.facts(MODEL), AUTO)
    assert parser is not None
    # "<|python_tag|>" spelled with ordinary tokens: only the token id is the marker.
    ids = tok.encode("<|python", add_special_tokens=False).ids
    ids += tok.encode('_tag|>{"name": "f", "parameters": {}}', add_special_tokens=False).ids
    assert 128010 not in ids
    msg = g.accumulate(g.run(parser, MODEL, [], [[i] for i in ids]))
    assert msg.calls() == []
    assert msg.content == tok.decode(ids, skip_special_tokens=False)


@needs_shared
def test_truncated_call_stays_a_call() -> None:
    msg = _parse('{"name": "get_weather", "parameters": {"city": "Pa')
    assert msg.calls() == [("get_weather", '{"city": "Pa')]
    assert msg.ended == {0}


@needs_shared
def test_tool_choice_none_keeps_json_as_content() -> None:
    text = '{"name": "get_weather", "parameters": {}}'
    msg = _parse(text, ParseRequest(tools=TOOLS, tool_choice="none", enable_auto_tools=True))
    assert (msg.content, msg.calls()) == (text, [])


@needs_shared
def test_object_without_name_is_dropped_and_index_not_used() -> None:
    text = '{"parameters": {"a": 1}}; {"name": "get_weather", "parameters": {}}'
    tok = g.tokenizer(MODEL)
    parser = build_chat_parser(None, "llama3_json", g.facts(MODEL), AUTO)
    assert parser is not None
    events = g.run(parser, MODEL, [], [tok.encode(text, add_special_tokens=False).ids])
    assert [e for e in events if isinstance(e, (ToolCallStart, ToolCallEnd))] == [
        ToolCallStart(0, "get_weather"),
        ToolCallEnd(0),
    ]


@needs_shared
@pytest.mark.parametrize(
    ("prefix", "filler"),
    [
        ("", " "),  # leading whitespace: held only up to a bound, then content
        ("Paris", " word"),  # content
        ('{"name": "f", "parameters": {"k": "', " word"),  # inside a string argument
        ('{"name": "f", "parameters": [', "[["),  # ever deeper nesting
        ('{"name": "f", "parameters": {}}; ', " word"),  # dropped text after a call
        ('{"name": "f", "parameters": {}}', ";"),  # separators
    ],
)
def test_state_under_1kb_after_10k_tokens(prefix: str, filler: str) -> None:
    tok = g.tokenizer(MODEL)
    parser = build_chat_parser(None, "llama3_json", g.facts(MODEL), AUTO)
    assert parser is not None
    state = parser.start([])
    if prefix:
        state, _ = parser.feed(state, tok.encode(prefix, add_special_tokens=False).ids, prefix)
    filler_ids = tok.encode(filler, add_special_tokens=False).ids
    assert len(filler_ids) == 1, "the filler must be one token"
    largest = 0
    for _ in range(10_000):
        state, _ = parser.feed(state, filler_ids, filler)
        largest = max(largest, len(msgspec.msgpack.encode(state)), len(msgspec.json.encode(state)))
    assert largest < 1024


@needs_shared
def test_python_tag_after_prose_opens_calls() -> None:
    msg = _parse('Sure.<|python_tag|>{"name": "get_weather", "parameters": {"city": "Oslo"}}')
    assert (msg.content, msg.calls()) == ("Sure.", [("get_weather", '{"city": "Oslo"}')])


@needs_shared
def test_name_without_arguments_is_a_call_with_empty_arguments() -> None:
    msg = _parse('{"name": "get_weather"}')
    assert (msg.content, msg.calls(), msg.ended) == (None, [("get_weather", "")], {0})
