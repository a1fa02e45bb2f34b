"""minimax_m2 (MiniMax-M2.x), both reasoning modes: split invariance, bounded state, the
argument grammar's whitespace allowances, append-think keeping the think block, structural tags.

Golden cases (every chunking, batch, render) are in tests/render_service/test_golden_glm_minimax.py.
"""

from __future__ import annotations

import json
from typing import Any

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from parsers import ChatParser, ParseRequest, build_chat_parser
from parsers._tag_engine import ARG_CLOSE, ARG_OPEN, ARG_TEXT, ArgScan
from parsers.engine_family import BoundEngine
from parsers.tools.minimax_m2 import scan_args
from tests.parsers import _engine_cases as cases
from tests.parsers import _golden as g
from tests.parsers.test_split_invariance import cut, run_roundtrip

needs_shared = pytest.mark.skipif(not g.shared_present(), reason="../shared is absent")
MODEL = "minimax-m2.7"
PROMPT = [200019, 200050, 10]  # ]~b]ai\n<think>\n
MODES = ["minimax_m2", "minimax_m2_append_think"]


def parser(request: ParseRequest, reasoning: str | None = "minimax_m2") -> ChatParser:
    built = build_chat_parser(reasoning, "minimax_m2", g.facts(MODEL), request)
    assert built is not None
    assert isinstance(built.chat, BoundEngine)
    return built


def answer(p: ChatParser, text: str, points: list[int] | None = None) -> g.Message:
    ids = g.tokenizer(MODEL).encode(text, add_special_tokens=False).ids
    return g.accumulate(run_roundtrip(p, MODEL, PROMPT, cut(ids, points or [])))  # type: ignore[arg-type]


@needs_shared
@settings(max_examples=120, deadline=None)
@given(
    text=cases.minimax_output(),
    points=st.lists(st.integers(0, 10_000), max_size=12),
    choice=st.sampled_from(["auto", "none", "required"]),
    mode=st.sampled_from(MODES),
)
def test_any_split_gives_the_same_answer(
    text: str, points: list[int], choice: str, mode: str
) -> None:
    p = parser(ParseRequest(tools=cases.TOOLS, tool_choice=choice, enable_auto_tools=True), mode)
    whole = answer(p, text)
    assert answer(p, text, points) == whole
    ids = g.tokenizer(MODEL).encode(text, add_special_tokens=False).ids
    one_token = g.accumulate(run_roundtrip(p, MODEL, PROMPT, cut(ids, list(range(10_000)))))  # type: ignore[arg-type]
    assert one_token == whole


@needs_shared
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize(
    ("prefix", "filler"),
    [
        ("", " word"),
        ("", "\n"),
        ("</think>", "\n"),
        ("</think>x", " word"),
        ('</think><invoke name="get_weather"><parameter name="city">', " word"),
        ('</think><invoke name="', "get"),  # a name that never ends
        ('</think><invoke name="free"><parameter name="', "k"),  # a parameter name that never ends
        ("</think>", "<"),
    ],
)
def test_state_under_1kb_after_10k_chunks(mode: str, prefix: str, filler: str) -> None:
    tok = g.tokenizer(MODEL)
    p = parser(ParseRequest(tools=cases.TOOLS, enable_auto_tools=True), mode)
    state = p.start(PROMPT)
    head = tok.encode(prefix, add_special_tokens=False).ids
    state, _ = p.feed(state, head, tok.decode(head, skip_special_tokens=False))
    filler_ids = tok.encode(filler, add_special_tokens=False).ids
    assert len(filler_ids) == 1
    largest = 0
    for _ in range(10_000):
        state, _ = p.feed(state, filler_ids, filler)
        largest = max(largest, len(msgspec.msgpack.encode(state)), len(msgspec.json.encode(state)))
    assert largest < 1024


@pytest.mark.parametrize(
    ("pieces", "ops"),
    [
        # vLLM's converter allows whitespace inside the tags and three quotings of the name.
        (['< parameter  name = "a" >1< / parameter >'], [(ARG_OPEN, "a"), (ARG_TEXT, "1"), (ARG_CLOSE, "")]),
        (["<parameter name=a>x</param", "eter>"], [(ARG_OPEN, "a"), (ARG_TEXT, "x"), (ARG_CLOSE, "")]),
        # A value without </parameter> ends where the next parameter starts.
        (["<parameter name='a'>x\n<parameter name='b'>y"], [(ARG_OPEN, "a"), (ARG_TEXT, "x\n"), (ARG_CLOSE, ""), (ARG_OPEN, "b"), (ARG_TEXT, "y")]),
        # A parameter without a name is read and skipped; text between parameters is ignored.
        (['<parameter name="">x</parameter>junk<parameter name="b">y</parameter>'], [(ARG_OPEN, "b"), (ARG_TEXT, "y"), (ARG_CLOSE, "")]),
    ],
)  # fmt: skip
def test_argument_scanner(pieces: list[str], ops: list[tuple[int, str]]) -> None:
    state, got = ArgScan(), []
    for piece in pieces:
        state, more = scan_args(state, piece, False)
        got.extend(more)
    state, more = scan_args(state, "", True)
    got.extend(more)
    merged: list[tuple[int, str]] = []
    for op in got:
        if merged and op[0] == ARG_TEXT and merged[-1][0] == ARG_TEXT:
            merged[-1] = (ARG_TEXT, merged[-1][1] + op[1])
        else:
            merged.append(op)
    assert merged == ops


@needs_shared
def test_append_think_keeps_the_think_block() -> None:
    # vLLM's intent for minimax_m2_append_think: content is "<think>" + the output, </think>
    # included; tool markup after </think> is parsed (vLLM's stream drops that </think>).
    text = 'R\n</think>\n\nOK.<minimax:tool_call>\n<invoke name="free">\n</invoke>\n</minimax:tool_call>'
    p = parser(ParseRequest(tools=cases.TOOLS, enable_auto_tools=True), "minimax_m2_append_think")
    msg = answer(p, text)
    assert (msg.reasoning, msg.content) == (None, "<think>R\n</think>\n\nOK.")
    assert msg.tool_calls == {0: ["free", "{}"]}


@needs_shared
def test_reasoning_mode_splits_the_think_block() -> None:
    text = 'R\n</think>\n\n<invoke name="get_weather">\n<parameter name="days">3</parameter>\n</invoke>'
    msg = answer(parser(ParseRequest(tools=cases.TOOLS, enable_auto_tools=True)), text)
    assert (msg.reasoning, msg.content) == ("R", None)
    assert msg.tool_calls == {0: ["get_weather", '{"days": 3}']}


@needs_shared
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize(
    ("after", "content"),
    [
        # `<invoke name=` typed in prose: an unknown function, the text after it kept.
        ("So <invoke name=...>; not now.", "So <invoke name=...>; not now."),
        ('\n<invoke name="nope">\n<parameter name="a">1</parameter>\n</invoke> ok',
         '\n<invoke name="nope">\n<parameter name="a">1</parameter>\n</invoke> ok'),
        ('See <invoke name="get_wea', 'See <invoke name="get_wea'),  # the name never ends
        # A call block's markup is a call's: an unknown function in it is dropped, markup and all.
        ('<minimax:tool_call>\n<invoke name="nope">\n</invoke>\n</minimax:tool_call>', None),
    ],
)  # fmt: skip
def test_typed_invoke_without_a_call_stays_content(
    mode: str, after: str, content: str | None
) -> None:
    p = parser(ParseRequest(tools=cases.TOOLS, enable_auto_tools=True), mode)
    msg = answer(p, "R\n</think>\n\n" + after)
    if mode == "minimax_m2_append_think":
        content = "<think>R\n</think>\n\n" + (content or "")
    elif content is not None:
        content = "\n\n" + content
    assert (msg.content, msg.tool_calls) == (content, {})


def _tag(function: str, schema: Any) -> dict[str, Any]:
    return {
        "type": "tag",
        "begin": f'<invoke name="{function}">\n',
        "content": {"type": "json_schema", "json_schema": schema, "style": "minimax_xml",
                    "any_order": False, "max_whitespace_cnt": None, "excludes": []},
        "end": "</invoke>\n",
    }  # fmt: skip


@needs_shared
def test_strict_tool_pins_its_schema_and_auto_needs_strictness() -> None:
    schema = {"type": "object", "properties": {"x": {"type": "string"}}}
    strict = {"type": "function", "function": {"name": "a", "strict": True, "parameters": schema}}
    loose = {"type": "function", "function": {"name": "b", "parameters": schema}}
    assert parser(ParseRequest(tools=[loose], enable_auto_tools=True)).structural_tag() is None
    tag = parser(ParseRequest(tools=[strict, loose], enable_auto_tools=True)).structural_tag()
    assert tag is not None
    calls = {"type": "tags_with_separator", "tags": [_tag("a", schema), _tag("b", True)],
             "separator": "", "at_least_one": True, "stop_after_first": False}  # fmt: skip
    assert json.loads(tag)["format"] == {
        "type": "triggered_tags",
        "triggers": ["<minimax:tool_call>"],
        "tags": [{"type": "tag", "begin": "<minimax:tool_call>\n", "content": calls,
                  "end": "</minimax:tool_call>"}],
        "at_least_one": False,
        "stop_after_first": False,
        "excludes": ["<think>", "</think>"],
    }  # fmt: skip
