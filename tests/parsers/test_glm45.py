"""glm45 (GLM-4.5/4.6): split invariance, bounded state, tags held back, structural tags.

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
from parsers.engine_family import BoundEngine
from tests.parsers import _engine_cases as cases
from tests.parsers import _golden as g
from tests.parsers.test_split_invariance import cut, run_roundtrip

needs_shared = pytest.mark.skipif(not g.shared_present(), reason="../shared is absent")
MODEL = "glm-4.5"
PROMPT = [151331, 151333, 151336, 198, 6023, 151337]  # [gMASK]<sop><|user|>\nhi<|assistant|>


def parser(request: ParseRequest, reasoning: str | None = "glm45") -> ChatParser:
    built = build_chat_parser(reasoning, "glm45", g.facts(MODEL), request)
    assert built is not None
    assert isinstance(built.chat, BoundEngine)
    return built


def answer(p: ChatParser, text: str, points: list[int] | None = None) -> g.Message:
    ids = g.tokenizer(MODEL).encode(text, add_special_tokens=False).ids
    chunks = cut(ids, points or [])
    return g.accumulate(run_roundtrip(p, MODEL, PROMPT, chunks))  # type: ignore[arg-type]


@needs_shared
@settings(max_examples=120, deadline=None)
@given(
    text=cases.glm_output(),
    points=st.lists(st.integers(0, 10_000), max_size=12),
    choice=st.sampled_from(["auto", "none", "required"]),
    thinking=st.booleans(),
)
def test_any_split_gives_the_same_answer(
    text: str, points: list[int], choice: str, thinking: bool
) -> None:
    request = ParseRequest(
        tools=cases.TOOLS,
        tool_choice=choice,
        chat_template_kwargs={} if thinking else {"enable_thinking": False},
        enable_auto_tools=True,
    )
    p = parser(request)
    whole = answer(p, text)
    assert answer(p, text, points) == whole
    one_token = cut(
        g.tokenizer(MODEL).encode(text, add_special_tokens=False).ids, list(range(10_000))
    )
    assert g.accumulate(run_roundtrip(p, MODEL, PROMPT, one_token)) == whole  # type: ignore[arg-type]


@needs_shared
@pytest.mark.parametrize(
    ("prefix", "filler"),
    [
        ("", " word"),  # reasoning
        ("", "\n"),  # reasoning's held trailing whitespace
        ("</think>", "\n"),  # content's held leading whitespace
        ("</think>x", " word"),  # content
        ("</think><tool_call>get_weather<arg_key>city</arg_key><arg_value>", " word"),
        ("</think><tool_call>", "get"),  # a name that never ends
        ("</think><tool_call>get_weather<arg_key>", "k"),  # a key that never ends
        ("</think>", "<"),  # text that keeps starting a tag
    ],
)
def test_state_under_1kb_after_10k_chunks(prefix: str, filler: str) -> None:
    tok = g.tokenizer(MODEL)
    p = parser(ParseRequest(tools=cases.TOOLS, enable_auto_tools=True))
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


@needs_shared
def test_a_partial_tag_waits_for_the_next_chunk() -> None:
    # Regression: vLLM's lexer holds "<arg" (a prefix of <arg_key>) in content; so do we.
    p = parser(ParseRequest(tools=cases.TOOLS, enable_auto_tools=True))
    state = p.start([*PROMPT, 198, 151350, 151351])  # the prompt already closed reasoning
    state, events = p.feed(state, [], "a <arg")
    assert g.accumulate(events).content == "a "
    state, events = p.feed(state, [], "s and")
    assert g.accumulate(events).content == "<args and"


@needs_shared
def test_unknown_function_is_dropped_with_its_markup() -> None:
    request = ParseRequest(tools=cases.TOOLS, enable_auto_tools=True)
    msg = answer(
        parser(request),
        "x</think>\n<tool_call>nope\n<arg_key>a</arg_key>\n<arg_value>1</arg_value>\n</tool_call>",
    )
    assert (msg.reasoning, msg.content, msg.tool_calls) == ("x", None, {})


@needs_shared
def test_values_are_typed_by_the_schema() -> None:
    text = (
        "</think><tool_call>cfg<arg_key>n</arg_key><arg_value>2</arg_value>"
        "<arg_key>on</arg_key><arg_value>TRUE</arg_value><arg_key>o</arg_key>"
        "<arg_value>{'a': 1}</arg_value><arg_key>l</arg_key><arg_value>null</arg_value>"
        "<arg_key>s</arg_key><arg_value>007</arg_value><arg_key>x</arg_key>"
        "<arg_value>[1]</arg_value></tool_call>"
    )
    msg = answer(parser(ParseRequest(tools=cases.TOOLS, enable_auto_tools=True)), text)
    name, arguments = msg.tool_calls[0]
    assert name == "cfg"
    assert json.loads(arguments) == {
        "n": 2, "on": True, "o": "{'a': 1}", "l": None, "s": "007", "x": "[1]",
    }  # fmt: skip


STRICT_TOOL = {
    "type": "function",
    "function": {
        "name": "a",
        "strict": True,
        "parameters": {"type": "object", "properties": {"x": {"type": "string"}}},
    },
}
# vLLM 0.33.0 (xgrammar 0.2.8's builtin GLM template) for a request whose tools are all strict.
_STRICT_TAG = {
    "type": "tag",
    "begin": "<tool_call>a",
    "content": {
        "type": "json_schema",
        "json_schema": {"type": "object", "properties": {"x": {"type": "string"}}},
        "style": "glm_xml",
        "any_order": False,
        "max_whitespace_cnt": None,
        "excludes": [],
    },
    "end": "</tool_call>",
}
_EXCLUDES = ["<think>", "</think>", "</tool_call>", "<arg_key>", "</arg_key>", "<arg_value>",
             "</arg_value>"]  # fmt: skip


@needs_shared
@pytest.mark.parametrize(
    ("choice", "expected"),
    [
        (
            "auto",
            {"type": "triggered_tags", "triggers": ["<tool_call>"], "tags": [_STRICT_TAG],
             "at_least_one": False, "stop_after_first": False, "excludes": _EXCLUDES},
        ),
        (
            "required",
            {"type": "triggered_tags", "triggers": ["<tool_call>"], "tags": [_STRICT_TAG],
             "at_least_one": True, "stop_after_first": False, "excludes": _EXCLUDES},
        ),
        ({"type": "function", "function": {"name": "a"}}, _STRICT_TAG),
    ],
)  # fmt: skip
def test_all_strict_tools_use_the_builtin_template(choice: Any, expected: dict[str, Any]) -> None:
    request = ParseRequest(tools=[STRICT_TOOL], tool_choice=choice, enable_auto_tools=True)
    tag = parser(request).structural_tag()
    assert tag is not None
    assert json.loads(tag) == {"type": "structural_tag", "format": expected}


@needs_shared
def test_no_tag_without_tools_or_with_tool_choice_none() -> None:
    assert parser(ParseRequest(enable_auto_tools=True)).structural_tag() is None
    none = ParseRequest(tools=[STRICT_TOOL], tool_choice="none", enable_auto_tools=True)
    assert parser(none).structural_tag() is None
