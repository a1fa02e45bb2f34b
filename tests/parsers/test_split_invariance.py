"""Split invariance: any chunking of an output gives the same events as one chunk.

Also checks that the state survives a msgspec json/msgpack round trip at every boundary.
Fixtures are the golden outputs plus outputs generated from each family's grammar.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from itertools import pairwise
from pathlib import Path
from typing import Any

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from parsers import (
    ChatParser,
    ChatState,
    ContentDelta,
    Event,
    ParseRequest,
    ReasoningDelta,
    ToolArgsDelta,
    build_chat_parser,
)
from tests.parsers import _golden as g

needs_shared = pytest.mark.skipif(not g.shared_present(), reason="../shared is absent")
SETTINGS = settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
STATE_JSON = msgspec.json.Decoder(ChatState)
STATE_MSGPACK = msgspec.msgpack.Decoder(ChatState)


def merged(events: Sequence[Event]) -> list[Event]:
    """Events with adjacent text deltas of the same kind joined (chunking-neutral form)."""
    out: list[Event] = []
    for ev in events:
        last = out[-1] if out else None
        if isinstance(ev, ReasoningDelta) and isinstance(last, ReasoningDelta):
            out[-1] = ReasoningDelta(last.text + ev.text)
        elif isinstance(ev, ContentDelta) and isinstance(last, ContentDelta):
            out[-1] = ContentDelta(last.text + ev.text)
        elif (
            isinstance(ev, ToolArgsDelta)
            and isinstance(last, ToolArgsDelta)
            and ev.index == last.index
        ):
            out[-1] = ToolArgsDelta(ev.index, last.text + ev.text)
        else:
            out.append(ev)
    return out


def run_roundtrip(
    parser: ChatParser, model: str, prompt: Sequence[int], chunks: Sequence[Sequence[int]]
) -> list[Event]:
    """Like `run`, but the state crosses json or msgpack at every chunk boundary."""
    state = parser.start(prompt)
    events: list[Event] = []
    for k, (chunk, text) in enumerate(zip(chunks, g.chunk_texts(model, chunks), strict=True)):
        if k % 2:
            state = STATE_JSON.decode(msgspec.json.encode(state))
        else:
            state = STATE_MSGPACK.decode(msgspec.msgpack.encode(state))
        state, evs = parser.feed(state, chunk, text)
        events.extend(evs)
    state, evs = parser.finish(STATE_JSON.decode(msgspec.json.encode(state)))
    return events + evs


def cut(ids: Sequence[int], points: Sequence[int]) -> list[list[int]]:
    bounds = sorted({p % (len(ids) + 1) for p in points} | {0, len(ids)})
    return [list(ids[a:b]) for a, b in pairwise(bounds)] or [[]]


def golden_fixtures() -> list[Path]:
    return g.chat_cases()


@needs_shared
@pytest.mark.parametrize(
    "path", golden_fixtures(), ids=lambda p: f"{p.parent.parent.name}/{p.stem}"
)
@SETTINGS
@given(points=st.lists(st.integers(min_value=0, max_value=10_000), max_size=40))
def test_golden_output_any_split(path: Path, points: list[int]) -> None:
    case = g.load(path)
    parser = g.chat_parser(case)
    model = g.model_dir(case)
    for choice in range(len(case["output"])):
        ids = g.output_ids(case, choice)
        whole = merged(g.run(parser, model, case["prompt_token_ids"], [ids]))
        split = merged(run_roundtrip(parser, model, case["prompt_token_ids"], cut(ids, points)))
        assert split == whole


def _words() -> st.SearchStrategy[str]:
    alphabet = st.sampled_from(list('abc xyz\n{}[]":,\\é天🦜<>/'))
    return st.text(alphabet, max_size=30)


def _json_values() -> st.SearchStrategy[Any]:
    scalars = st.none() | st.booleans() | st.integers(-1000, 1000) | _words()
    return st.recursive(
        scalars,
        lambda inner: st.lists(inner, max_size=3) | st.dictionaries(_words(), inner, max_size=3),
        max_leaves=8,
    )


TOOLS = [{"type": "function", "function": {"name": "f", "parameters": {}}}]


@needs_shared
@SETTINGS
@given(
    reasoning=_words(),
    content=_words(),
    calls=st.lists(
        st.tuples(st.sampled_from(["f", "get_weather", "名前"]), _json_values()), max_size=3
    ),
    compact=st.booleans(),
    points=st.lists(st.integers(min_value=0, max_value=10_000), max_size=30),
)
def test_generated_qwen3_hermes(
    reasoning: str,
    content: str,
    calls: list[tuple[str, Any]],
    compact: bool,
    points: list[int],
) -> None:
    sep = "" if compact else "\n"
    text = f"<think>{reasoning}</think>{content}" + "".join(
        f'<tool_call>{sep}{{"name": {json.dumps(name)}, "arguments": '
        f"{json.dumps(args, ensure_ascii=False)}}}{sep}</tool_call>"
        for name, args in calls
    )
    tok = g.tokenizer("qwen3")
    ids = tok.encode(text, add_special_tokens=False).ids
    request = ParseRequest(tools=TOOLS, enable_auto_tools=True)
    parser = build_chat_parser("qwen3", "hermes", g.facts("qwen3"), request)
    assert parser is not None
    whole = g.run(parser, "qwen3", [], [ids])
    assert merged(run_roundtrip(parser, "qwen3", [], cut(ids, points))) == merged(whole)
    msg = g.accumulate(whole)
    # Independent oracle: the arguments are exactly the JSON text the "model" wrote.
    expected_calls = [(name, json.dumps(args, ensure_ascii=False)) for name, args in calls]
    assert msg.calls() == expected_calls
    assert msg.reasoning == (reasoning or None)
    assert msg.content == (content or None)


@needs_shared
@SETTINGS
@given(
    lead=st.sampled_from(["", "<|python_tag|>", " \n"]),
    calls=st.lists(
        st.tuples(
            st.sampled_from(["f", "get_weather", "名前"]),
            st.sampled_from(["parameters", "arguments"]),
            _json_values(),
        ),
        max_size=3,
    ),
    tail=_words(),
    points=st.lists(st.integers(min_value=0, max_value=10_000), max_size=30),
)
def test_generated_llama3_json(
    lead: str, calls: list[tuple[str, str, Any]], tail: str, points: list[int]
) -> None:
    text = lead + "; ".join(
        f'{{"name": {json.dumps(name)}, "{key}": {json.dumps(args, ensure_ascii=False)}}}'
        for name, key, args in calls
    )
    if calls:
        text += tail
    model = "llama-3.1-instruct"
    ids = g.tokenizer(model).encode(text, add_special_tokens=False).ids
    parser = build_chat_parser(
        None, "llama3_json", g.facts(model), ParseRequest(tools=TOOLS, enable_auto_tools=True)
    )
    assert parser is not None
    whole = g.run(parser, model, [], [ids])
    assert merged(run_roundtrip(parser, model, [], cut(ids, points))) == merged(whole)
    msg = g.accumulate(whole)
    # Independent oracle: the arguments are exactly the JSON text the "model" wrote.
    assert msg.calls() == [(name, json.dumps(args, ensure_ascii=False)) for name, _, args in calls]
    # Without calls the answer is content; text after calls is dropped.
    assert msg.content == (None if calls else text or None)
