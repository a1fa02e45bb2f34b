"""The pythonic family: Python call lists to JSON arguments, streamed, any chunking.

The reference for well-formed lists is Python itself: vLLM 0.33's batch parser reads the output
with `ast` and writes each call's keyword values with `json.dumps(..., ensure_ascii=False)`; the
property test below renders random literals with `repr` and expects exactly that JSON. The table
pins what happens to text that is not a call list (golden README, "Gemma 3"; docs/compat.md).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from itertools import pairwise
from pathlib import Path
from typing import Any

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from parsers import ParseRequest, TokenizerFacts, build_chat_parser
from parsers.events import ContentDelta, Event, ToolArgsDelta, ToolCallEnd, ToolCallStart
from parsers.tools.pythonic import PythonicCall, close, forced_tool_schema, scan
from tests.parsers._calls import outcome

STATE = msgspec.msgpack.Decoder(PythonicCall)


def run(pieces: Sequence[str]) -> list[Event]:
    """Feed text pieces, crossing msgpack at every boundary, then close."""
    state = PythonicCall(index=0)
    events: list[Event] = []
    for piece in pieces:
        state = STATE.decode(msgspec.msgpack.encode(state))
        state, more = scan(state, piece)
        events.extend(more)
    return events + close(state)


def split(text: str, points: Sequence[int]) -> list[str]:
    bounds = sorted({p % (len(text) + 1) for p in points} | {0, len(text)})
    return [text[a:b] for a, b in pairwise(bounds)]


CASES: list[tuple[str, str, list[tuple[str, str]], str | None]] = [
    # (case, model output, calls, content)
    (
        "tool_call_single",
        "[get_weather(city='Paris', unit='celsius')]",
        [("get_weather", '{"city": "Paris", "unit": "celsius"}')],
        None,
    ),
    (
        "two_parallel_tool_calls",
        "[get_weather(city='Paris'), search_web(query=\"Paris events\", max_results=5)]",
        [
            ("get_weather", '{"city": "Paris"}'),
            ("search_web", '{"query": "Paris events", "max_results": 5}'),
        ],
        None,
    ),
    (
        "tool_call_typed_args",
        "[search_web(query='x', max_results=3, ratio=0.5, safe=True, lang=None, tags=['a', 'b'], opts={'k': 1})]",
        [
            (
                "search_web",
                '{"query": "x", "max_results": 3, "ratio": 0.5, "safe": true, "lang": null, '
                '"tags": ["a", "b"], "opts": {"k": 1}}',
            )
        ],
        None,
    ),
    ("no_arguments", "[get_time()]", [("get_time", "{}")], None),
    (
        "dotted_name",
        "[tools.math.add(a=-1, b=+2.5)]",
        [("tools.math.add", '{"a": -1, "b": 2.5}')],
        None,
    ),
    (
        "tuples_sets_and_keys",
        "[f(a=(1, 2), b={3}, c={1: 'x', True: None, 1.5: ()}, d=(), e={})]",
        [
            (
                "f",
                '{"a": [1, 2], "b": [3], "c": {"1": "x", "true": null, "1.5": []}, "d": [], "e": {}}',
            )
        ],
        None,
    ),
    (
        "string_forms",
        "[f(a='x' \"y\", b=r'\\d', c='''two\nlines''', d=f'{{x}}', e='\\u00e9\\N{BULLET}\\x41\\101')]",
        [("f", '{"a": "xy", "b": "\\\\d", "c": "two\\nlines", "d": "{x}", "e": "é•AA"}')],
        None,
    ),
    (
        "numbers",
        "[f(a=0x1F, b=1_000, c=.5, d=5., e=1e3, f=1e999, g=-0.0, h=null, i=true)]",
        [
            (
                "f",
                '{"a": 31, "b": 1000, "c": 0.5, "d": 5.0, "e": 1000.0, "f": Infinity, "g": -0.0, "h": null, "i": true}',
            )
        ],
        None,
    ),
    ("trailing_commas", "[f(a=1,), g(b=[1,],),]", [("f", '{"a": 1}'), ("g", '{"b": [1]}')], None),
    ("whitespace_after_list", "[f(a=1)]\n\n", [("f", '{"a": 1}')], None),
    # The list never closes: the calls that did close are calls (as vLLM streams them).
    (
        "tool_call_unclosed_list",
        "[get_weather(city='Paris')",
        [("get_weather", '{"city": "Paris"}')],
        None,
    ),
    # Cut by max_tokens: partial arguments, as vLLM streams them.
    (
        "truncated_second_call",
        "[get_weather(city='Paris'), search_web(query='Par",
        [("get_weather", '{"city": "Paris"}'), ("search_web", '{"query": "Par')],
        None,
    ),
    # Not a call list: content, as vLLM's batch answer gives it.
    (
        "content_before_tool_call",
        "Sure. [get_weather(city='Paris')]",
        [],
        "Sure. [get_weather(city='Paris')]",
    ),
    ("tool_call_positional_arg", "[get_weather('Paris')]", [], "[get_weather('Paris')]"),
    ("truncated_after_name", "[get_weather", [], "[get_weather"),
    (
        "json_list_not_pythonic",
        '[{"name": "f", "arguments": {}}]',
        [],
        '[{"name": "f", "arguments": {}}]',
    ),
    ("empty_list", "[]", [], "[]"),
    ("markdown_link", "[the docs](https://example.com)", [], "[the docs](https://example.com)"),
    ("expression_value", "[f(a=x + 1)]", [], "[f(a=x + 1)]"),
    ("bytes_value", "[f(a=b'x')]", [], "[f(a=b'x')]"),
    # Calls read before a malformed part stay calls; the rest is content (nothing is lost).
    ("text_after_tool_calls", "[f(a=1)] Done.", [("f", '{"a": 1}')], " Done."),
    ("second_call_positional", "[f(a=1), g('x')]", [("f", '{"a": 1}')], ", g('x')]"),
    ("malformed_later_argument", "[f(a=1, b=c)]", [("f", '{"a": 1')], ", b=c)]"),
    (
        "tool_call_syntax_error",
        "[get_weather(city='Paris)]",
        [("get_weather", '{"city": "Paris)]')],
        None,
    ),
    ("second_list", "[f(a=1)][g(b=2)]", [("f", '{"a": 1}')], "[g(b=2)]"),
]


@pytest.mark.parametrize(
    ("output", "calls", "content"),
    [pytest.param(o, c, t, id=name) for name, o, c, t in CASES],
)
def test_cases_whole_and_per_character(
    output: str, calls: list[tuple[str, str]], content: str | None
) -> None:
    assert outcome(run([output])) == (calls, content)
    assert outcome(run(list(output))) == (calls, content)


@pytest.mark.parametrize("output", [pytest.param(o, id=name) for name, o, _, _ in CASES])
@settings(max_examples=30, deadline=None)
@given(points=st.lists(st.integers(min_value=0, max_value=400), max_size=12))
def test_split_invariance(output: str, points: list[int]) -> None:
    assert merged(run(split(output, points))) == merged(run([output]))


def merged(events: Sequence[Event]) -> list[Event]:
    """Events with adjacent text joined and empty content deltas (vLLM's per-chunk `""`) dropped."""
    out: list[Event] = []
    for event in events:
        if isinstance(event, ContentDelta) and not event.text:
            continue
        last = out[-1] if out else None
        if isinstance(event, ContentDelta) and isinstance(last, ContentDelta):
            out[-1] = ContentDelta(last.text + event.text)
        elif isinstance(event, ToolArgsDelta) and isinstance(last, ToolArgsDelta):
            out[-1] = ToolArgsDelta(event.index, last.text + event.text)
        else:
            out.append(event)
    return out


def test_every_call_ends_once() -> None:
    events = run(list("[f(a=1), g(b='x'), h()]"))
    assert [e.index for e in events if isinstance(e, ToolCallEnd)] == [0, 1, 2]
    assert [e.index for e in events if isinstance(e, ToolCallStart)] == [0, 1, 2]


# -- Python literals, rendered by repr, read back as JSON --------------------------------

_names = st.sampled_from(["get_weather", "search", "f", "do_it", "x2"])
_scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(10**30), max_value=10**30)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20)
)


def _containers(children: Any) -> Any:
    return (
        st.lists(children, max_size=4)
        | st.lists(children, max_size=4).map(tuple)
        | st.dictionaries(st.text(max_size=6), children, max_size=4)
    )


_values = st.recursive(_scalars, _containers, max_leaves=12)


def _source(value: Any) -> str:
    """Python source of a literal: `repr`, with containers spaced at random-free defaults."""
    return repr(value)


def _json(value: Any) -> Any:
    """What `json.dumps` sees once the literal is read back (tuples are lists)."""
    if isinstance(value, tuple | list):
        return [_json(v) for v in value]
    if isinstance(value, dict):
        return {k: _json(v) for k, v in value.items()}
    return value


_calls = st.lists(
    st.tuples(
        _names,
        st.dictionaries(
            st.from_regex(r"[a-z_][a-z0-9_]{0,8}", fullmatch=True), _values, max_size=4
        ),
    ),
    min_size=1,
    max_size=3,
)


@settings(max_examples=200, deadline=None)
@given(calls=_calls, points=st.lists(st.integers(min_value=0, max_value=2000), max_size=20))
def test_random_literals_match_json_dumps(
    calls: list[tuple[str, dict[str, Any]]], points: list[int]
) -> None:
    text = (
        "["
        + ", ".join(
            f"{name}(" + ", ".join(f"{k}={_source(v)}" for k, v in kwargs.items()) + ")"
            for name, kwargs in calls
        )
        + "]"
    )
    expected = [
        (name, json.dumps({k: _json(v) for k, v in kwargs.items()}, ensure_ascii=False))
        for name, kwargs in calls
    ]
    assert outcome(run(split(text, points))) == (expected, None)


def test_state_stays_small_inside_a_long_string() -> None:
    state = PythonicCall(index=0)
    state, _ = scan(state, "[write_file(path='a.md', content='")
    largest = 0
    for _ in range(10_000):
        state, _ = scan(state, " word\\n")
        largest = max(largest, len(msgspec.msgpack.encode(state)), len(msgspec.json.encode(state)))
    assert largest < 1024


def test_state_stays_small_over_many_calls_and_nesting() -> None:
    state = PythonicCall(index=0)
    state, _ = scan(state, "[")
    largest = 0
    for k in range(10_000):
        piece = f"f(a={k}, b=[{{'x': (1,)}}]), " if k % 3 else "g(c=None), "
        state, _ = scan(state, piece)
        largest = max(largest, len(msgspec.json.encode(state)))
    assert largest < 1024


def test_deep_nesting_is_bounded() -> None:
    state = PythonicCall(index=0)
    events: list[Event] = []
    state, events = scan(state, "[f(a=" + "[" * 10_000)
    assert len(msgspec.json.encode(state)) < 1024
    _, content = outcome([*events, *close(state)])
    assert content is not None and content.endswith("[[[")


# -- the family in the chat machine ------------------------------------------------------

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
FACTS = TokenizerFacts.from_added_tokens({"<end_of_turn>": 106}, [106])
GOLDEN = Path(__file__).resolve().parents[2].parent / "shared" / "golden" / "gemma-3-it"


def chat(pieces: Sequence[str], **request: Any) -> list[Event]:
    fields: dict[str, Any] = {"tools": TOOLS, "enable_auto_tools": True, **request}
    parser = build_chat_parser(None, "pythonic", FACTS, ParseRequest(**fields))
    assert parser is not None
    state = parser.start([2, 105])
    events: list[Event] = []
    for piece in pieces:
        state, more = parser.feed(state, [100] if piece else [106], piece)
        events += more
    return events + parser.finish(state)[1]


NAMED = {"tool_choice": {"type": "function", "function": {"name": "get_weather"}}}


@pytest.mark.parametrize(
    ("output", "request_fields", "expected"),
    [
        pytest.param("[get_time()]", {}, ([("get_time", "{}")], None), id="auto"),
        pytest.param("[get_time()]", {"tools": None}, ([], "[get_time()]"), id="no_tools"),
        pytest.param(
            "[get_time()]", {"tool_choice": "none"}, ([], "[get_time()]"), id="tool_choice_none"
        ),
        # vLLM takes the whole answer as the named tool's arguments (tool_choice_named*).
        pytest.param(
            '{"city": "Paris"}', NAMED, ([("get_weather", '{"city": "Paris"}')], None), id="named"
        ),
        pytest.param(
            "[get_weather(city='Paris')]",
            NAMED,
            ([("get_weather", "[get_weather(city='Paris')]")], None),
            id="named_pythonic",
        ),
        # "required": vLLM's JSON list, or a pythonic list.
        pytest.param(
            '[{"name": "get_weather", "parameters": {"city": "Paris"}}]',
            {"tool_choice": "required"},
            ([("get_weather", '{"city": "Paris"}')], None),
            id="required_json",
        ),
        pytest.param(
            "[get_weather(city='Paris')]",
            {"tool_choice": "required"},
            ([("get_weather", '{"city": "Paris"}')], None),
            id="required_pythonic",
        ),
    ],
)
def test_tool_choice_modes(output: str, request_fields: dict[str, Any], expected: Any) -> None:
    assert outcome(chat([output], **request_fields)) == expected
    assert outcome(chat(list(output), **request_fields)) == expected


def test_empty_chunks_get_vllms_empty_content_delta() -> None:
    # gemma-3-it/derender/tool_call_single, one_token: the EOS chunk after "]" is content "".
    events = chat(["[get_time()]", ""])
    assert events[-1] == ContentDelta("")
    plain = chat(["Hello", ""])
    assert plain[-1] == ContentDelta("")
    assert ContentDelta("") not in chat(["[get_ti", "", "me()]"])[:2]


@pytest.mark.skipif(not GOLDEN.is_dir(), reason="../shared/golden/gemma-3-it is absent")
@pytest.mark.parametrize("name", ["tools_required", "tools_several_auto", "tools_none"])
def test_render_adjustments_match_vllm(name: str) -> None:
    case = json.loads((GOLDEN / "render" / f"{name}.json").read_text(encoding="utf-8"))
    request = case["request"]
    parse_request = ParseRequest(
        tools=request.get("tools"), tool_choice=request.get("tool_choice"), enable_auto_tools=True
    )
    parser = build_chat_parser(None, "pythonic", FACTS, parse_request)
    assert parser is not None
    structured = case["response"]["sampling_params"].get("structured_outputs")
    assert parser.render_adjustments().json_schema == (structured["json"] if structured else None)


def test_named_schema_is_the_tools_parameters() -> None:
    named = ParseRequest(tools=TOOLS, **NAMED)
    assert forced_tool_schema(named) == TOOLS[0]["function"]["parameters"]
    no_params = ParseRequest(
        tools=TOOLS, tool_choice={"type": "function", "function": {"name": "get_time"}}
    )
    assert forced_tool_schema(no_params) == {"type": "object", "properties": {}}
    single = forced_tool_schema(
        ParseRequest(tools=TOOLS, tool_choice="required", parallel_tool_calls=False)
    )
    assert single is not None and single["maxItems"] == 1
