"""qwen3_coder (XML) tool calls: generated outputs checked against an independent batch oracle.

The golden corpus has no qwen3_coder server, so the oracle is a regex parse of the whole text
written here, following the format's documented rules (one wrapping newline trimmed, values
typed by the tool schema), serialized as vLLM does (`json.dumps(..., ensure_ascii=False)`).
"""

from __future__ import annotations

import json
import re
from itertools import pairwise
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from parsers import ParseRequest, build_chat_parser
from tests.parsers import _golden as g

needs_shared = pytest.mark.skipif(not g.shared_present(), reason="../shared is absent")

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {
                "type": "object",
                "properties": {
                    "city": {"type": "string"},
                    "days": {"type": "integer"},
                    "opts": {"type": "object"},
                },
            },
        },
    }
]
TYPES = {"city": str, "days": int, "opts": dict}

_CALL = re.compile(r"<function=([^>]*)>(.*?)</function>", re.S)
_PARAM = re.compile(r"<parameter=([^>]*)>(.*?)</parameter>", re.S)


def oracle(text: str) -> list[tuple[str, str]]:
    calls = []
    for name, body in _CALL.findall(text):
        params: dict[str, Any] = {}
        for key, raw in _PARAM.findall(body):
            value = raw.removeprefix("\n").removesuffix("\n")
            kind = TYPES.get(key, str)
            if kind is not str:
                try:
                    decoded = json.loads(value)
                    params[key] = decoded if isinstance(decoded, kind) else value
                except ValueError:
                    params[key] = value
            else:
                params[key] = value
        calls.append((name.strip(), json.dumps(params, ensure_ascii=False)))
    return calls


def render(calls: list[list[tuple[str, Any]]]) -> str:
    out = []
    for params in calls:
        body = "".join(
            f"<parameter={k}>\n{v if isinstance(v, str) else json.dumps(v)}\n</parameter>\n"
            for k, v in params
        )
        out.append(f"<tool_call>\n<function=get_weather>\n{body}</function>\n</tool_call>")
    return "\n".join(out)


_TEXT = st.text(st.sampled_from(list('ab é天🦜\n"\\<>/=')), max_size=25)
_PARAM_VALUES = st.one_of(
    st.tuples(st.just("city"), _TEXT),
    st.tuples(st.just("days"), st.integers(-5, 500)),
    st.tuples(st.just("opts"), st.dictionaries(st.sampled_from(["a", "b"]), st.integers(0, 9))),
    st.tuples(st.just("note"), _TEXT),
)


@needs_shared
@settings(max_examples=60, deadline=None)
@given(
    calls=st.lists(st.lists(_PARAM_VALUES, max_size=3, unique_by=lambda p: p[0]), max_size=2),
    points=st.lists(st.integers(0, 10_000), max_size=30),
)
def test_generated_calls_match_oracle_at_any_split(
    calls: list[list[tuple[str, Any]]], points: list[int]
) -> None:
    text = render(calls)
    tok = g.tokenizer("qwen3")
    ids = tok.encode(text, add_special_tokens=False).ids
    request = ParseRequest(tools=TOOLS, enable_auto_tools=True)
    parser = build_chat_parser(None, "qwen3_coder", g.facts("qwen3"), request)
    assert parser is not None
    bounds = sorted({p % (len(ids) + 1) for p in points} | {0, len(ids)})
    chunks = [ids[a:b] for a, b in pairwise(bounds)] or [[]]
    msg = g.accumulate(g.run(parser, "qwen3", [], chunks))
    assert msg.calls() == oracle(text)
    assert msg.content is None


@needs_shared
def test_call_cut_inside_a_value_stays_as_streamed() -> None:
    text = "<tool_call>\n<function=get_weather>\n<parameter=city>\nPar"
    tok = g.tokenizer("qwen3")
    ids = tok.encode(text, add_special_tokens=False).ids
    parser = build_chat_parser(
        None, "qwen3_xml", g.facts("qwen3"), ParseRequest(tools=TOOLS, enable_auto_tools=True)
    )
    assert parser is not None
    msg = g.accumulate(g.run(parser, "qwen3", [], [[i] for i in ids]))
    # Cut inside a value: the arguments stay as streamed, unterminated (as vLLM streams them).
    assert msg.calls() == [("get_weather", '{"city": "Par')]
    assert msg.ended == {0}
