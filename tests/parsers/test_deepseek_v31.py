"""deepseek_v3 reasoning + deepseek_v31 tool calls: vLLM 0.33.0 golden cases and generated outputs."""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import msgspec
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from parsers import ChatState, ContentDelta, Event, ParseRequest, build_chat_parser
from parsers.tools.deepseek_v31 import (
    CALL_BEGIN,
    CALL_END,
    CALLS_BEGIN,
    CALLS_END,
    MAX_NAME,
    SEP,
    section_structural_tag,
)
from tests.parsers import _golden as g
from tests.parsers.test_split_invariance import cut, merged, run_roundtrip

MODEL = "deepseek-v3.1"
WHOLE = "a call in one chunk is a call (vLLM's whole chunking emits none and drops the content)"
CLOSING_PIECE = "the argument piece that arrives with <｜tool▁call▁end｜> is kept (vLLM cuts it)"
MISSING_END = "<｜tool▁calls▁end｜> closes the open call and is not argument text"
AS_STREAMED = "batch is the accumulated stream (vLLM batch drops cut calls and text after calls)"
EMPTY_REASONING = "reasoning that closes empty is null, as streamed (vLLM batch: '')"
EMPTY_SECTION = "an empty section leaves content '', as streamed (vLLM batch: null)"
STOP_IN_CALL = "a stop string is cut by the derender layer, after parsing"

TOOL_CASES_WHOLE = (
    "logprobs_tool_call",
    "missing_tool_calls_end_eos",
    "parallel_false_two_calls",
    "return_token_ids_tool",
    "tool_call_after_reasoning",
    "tool_call_args_not_json",
    "tool_call_args_python_literal",
    "tool_call_long_arguments",
    "tool_call_single",
    "tool_call_unknown_function",
    "tool_call_v3_format",
    "two_parallel_tool_calls",
)
# A forced call in one chunk: the call, and no '' deltas (vLLM: nothing). Batch: the call and
# content '', as vLLM's batch (batch rule 3).
FORCED_CALL = [("get_weather", '{"city": "Paris", "unit": "celsius"}')]
FORCED_WHOLE = {
    (case, mode): (None, FORCED_CALL)
    for case in ("tool_choice_named_markup", "tool_choice_required_markup")
    for mode in ("whole",)
}
STREAM: g.Divergences = {
    **{(case, "whole"): ("batch", WHOLE) for case in TOOL_CASES_WHOLE},
    ("text_after_tool_calls", "whole"): ("stream:one_token", WHOLE),
    ("truncated_second_call", "whole"): ("stream:random_1_5", WHOLE),
    **{key: ("own", WHOLE) for key in FORCED_WHOLE if key[1] == "whole"},
    **{
        (case, "random_1_5"): ("stream:one_token", CLOSING_PIECE)
        for case in (
            "tool_call_args_python_literal",
            "tool_call_long_arguments",
            "tool_call_v3_format",
            "two_parallel_tool_calls",
        )
    },
}
BATCH: g.Divergences = {
    ("text_after_tool_calls", "batch"): ("stream:one_token", AS_STREAMED),
    ("thinking_empty_reasoning", "batch"): ("stream:whole", EMPTY_REASONING),
    ("tool_calls_empty_block", "batch"): ("stream:whole", EMPTY_SECTION),
    ("stop_string_inside_call", "batch"): ("prefix", STOP_IN_CALL),
}
# Our answer where no vLLM answer equals it (the golden case, mode) -> (content, calls).
MISSING_END_CALL = [("get_weather", '{"city": "Paris"}')]
EXPECTED: dict[tuple[str, str], tuple[str | None, list[tuple[str, str]]]] = {
    ("missing_tool_call_end", "one_token"): ("", MISSING_END_CALL),
    ("missing_tool_call_end", "random_1_5"): (None, MISSING_END_CALL),
    ("missing_tool_call_end", "whole"): (None, MISSING_END_CALL),
    ("missing_tool_call_end", "batch"): (None, []),
}
EXPECTED_CASES = {case for case, _ in EXPECTED}

CASES = [p for p in g.chat_cases(MODEL) if p.stem not in EXPECTED_CASES]
needs_shared = pytest.mark.skipif(not g.shared_present(), reason="../shared is absent")
SETTINGS = settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {}}}]
STATE_BYTES = msgspec.msgpack.Encoder()


@needs_shared
@pytest.mark.parametrize("path", CASES, ids=[p.stem for p in CASES])
def test_golden_case(path: Path) -> None:
    g.check_case(path, STREAM, BATCH)


@needs_shared
@pytest.mark.parametrize(("case", "mode"), sorted(EXPECTED | FORCED_WHOLE))
def test_golden_case_where_no_vllm_answer_is_ours(case: str, mode: str) -> None:
    # missing_tool_call_end: its streams put the section marker into the arguments
    # (docs/compat.md); ours end the call where the section does. The batch answer drops the
    # call, as vLLM's does (batch rule 1: its <｜tool▁call▁end｜> never came).
    data = g.load(g.GOLDEN / MODEL / "derender" / f"{case}.json")
    parser = g.chat_parser(data)
    ids = g.output_ids(data)
    if mode == "batch":
        text = g.tokenizer(MODEL).decode(ids, skip_special_tokens=False)
        batch = parser.parse_batch(data["prompt_token_ids"], ids, text)
        calls = [(c.name, c.arguments) for c in batch.tool_calls]
        assert (batch.reasoning, batch.content, calls) == (None, *EXPECTED[(case, mode)])
        return
    chunks = list(g.split(ids, data["stream"]["chunkings"][mode]["chunk_sizes"]))
    msg = g.accumulate(g.run(parser, MODEL, data["prompt_token_ids"], chunks))
    assert (msg.reasoning, msg.content, msg.calls()) == (
        None,
        *(EXPECTED | FORCED_WHOLE)[(case, mode)],
    )


def _parser(request: ParseRequest, reasoning: str | None = "deepseek_v3") -> Any:
    parser = build_chat_parser(reasoning, "deepseek_v31", g.facts(MODEL), request)
    assert parser is not None
    return parser


def _ids(text: str) -> list[int]:
    return list(g.tokenizer(MODEL).encode(text, add_special_tokens=False).ids)


def _plain(text: str) -> list[int]:
    """`text` as ordinary tokens: every marker spelling split so it never becomes its token."""
    ids: list[int] = []
    for piece in re.split(r"(<｜)", text):
        ids.extend(_ids(piece))
    return ids


def _parse(ids: Sequence[int], request: ParseRequest, prompt: Sequence[int] = ()) -> g.Message:
    return g.accumulate(g.run(_parser(request), MODEL, prompt, [[i] for i in ids]))


AUTO = ParseRequest(tools=TOOLS, enable_auto_tools=True)


@needs_shared
@pytest.mark.parametrize(
    ("output", "content", "calls"),
    [
        # Text between calls is content (vLLM: streamed, dropped in batch).
        (
            f"{CALLS_BEGIN}{CALL_BEGIN}a{SEP}{{}}{CALL_END}\n{CALL_BEGIN}b{SEP}[1]{CALL_END}{CALLS_END}",
            "\n",
            [("a", "{}"), ("b", "[1]")],
        ),
        # A call missing <｜tool▁call▁end｜> ends at the next call.
        (
            f"{CALLS_BEGIN}{CALL_BEGIN}a{SEP}x{CALL_BEGIN}b{SEP}y{CALL_END}{CALLS_END}",
            None,
            [("a", "x"), ("b", "y")],
        ),
        # No name, a name with a line break, no separator: no call, no index used.
        (
            f"{CALLS_BEGIN}{CALL_BEGIN}{SEP}x{CALL_END}{CALL_BEGIN}a\nb{SEP}y{CALL_END}"
            f"{CALL_BEGIN}c{CALL_END}{CALL_BEGIN}d{SEP}z{CALL_END}{CALLS_END}",
            None,
            [("d", "z")],
        ),
        # A second separator is argument text; the name is taken as written.
        (f"{CALLS_BEGIN}{CALL_BEGIN} a {SEP}x{SEP}y{CALL_END}", None, [(" a ", f"x{SEP}y")]),
        # <｜tool▁call▁begin｜> outside a section is content.
        (f"Hi {CALL_BEGIN}a{SEP}x{CALL_END}", f"Hi {CALL_BEGIN}a{SEP}x{CALL_END}", []),
        # Content before, and text after the section.
        (
            f"Sure.{CALLS_BEGIN}{CALL_BEGIN}a{SEP}{{}}{CALL_END}{CALLS_END} Done.",
            "Sure. Done.",
            [("a", "{}")],
        ),
        # A second section parses too.
        (
            f"{CALLS_BEGIN}{CALL_BEGIN}a{SEP}1{CALL_END}{CALLS_END}x"
            f"{CALLS_BEGIN}{CALL_BEGIN}b{SEP}2{CALL_END}{CALLS_END}",
            "x",
            [("a", "1"), ("b", "2")],
        ),
    ],
)
def test_section_recovery(output: str, content: str | None, calls: list[tuple[str, str]]) -> None:
    msg = g.accumulate(g.run(_parser(AUTO), MODEL, [], [_ids(output)]))
    assert (msg.content, msg.calls()) == (content, calls)


@needs_shared
def test_marker_spellings_typed_as_text_are_content() -> None:
    text = f"Write {CALLS_BEGIN}{CALL_BEGIN}f{SEP}{{}}{CALL_END}{CALLS_END} to call."
    msg = _parse(_plain(text), AUTO)
    assert (msg.content, msg.calls()) == (text, [])


@needs_shared
@pytest.mark.parametrize(
    "request_",
    [
        ParseRequest(tools=TOOLS, tool_choice="none", enable_auto_tools=True),
        ParseRequest(enable_auto_tools=True),
        ParseRequest(tools=TOOLS, enable_auto_tools=False),
    ],
)
def test_markup_is_content_when_tools_are_off(request_: ParseRequest) -> None:
    text = f"{CALLS_BEGIN}{CALL_BEGIN}f{SEP}{{}}{CALL_END}{CALLS_END}"
    msg = g.accumulate(g.run(_parser(request_), MODEL, [], [_ids(text)]))
    assert (msg.content, msg.calls()) == (text, [])


@needs_shared
@pytest.mark.parametrize(
    ("kwargs", "reasoning", "content"),
    [
        ({}, None, "<think>a</think>b"),
        ({"thinking": False}, None, "<think>a</think>b"),
        ({"thinking": True}, "a", "b"),
        ({"enable_thinking": True}, "a", "b"),
    ],
)
def test_thinking_switch(kwargs: dict[str, Any], reasoning: str | None, content: str) -> None:
    # Only `thinking`/`enable_thinking` true splits reasoning (vLLM's deepseek_v3 picks R1's
    # parser then, else its identity parser, which keeps both tags as content); R1 absorbs a
    # <think> the model repeats.
    request = ParseRequest(chat_template_kwargs=kwargs, enable_auto_tools=True)
    msg = _parse(_ids("<think>a</think>b"), request)
    assert (msg.reasoning, msg.content) == (reasoning, content)


@needs_shared
@pytest.mark.parametrize(
    ("kwargs", "prompt_tail", "ended"),
    [
        ({}, "<｜Assistant｜></think>", True),
        ({}, "<｜User｜>hi", True),  # thinking off: vLLM's identity parser says ended
        ({"thinking": True}, "<｜Assistant｜><think>", False),
        ({"thinking": True}, "<｜Assistant｜></think>One,", True),
    ],
)
def test_reasoning_ended(kwargs: dict[str, Any], prompt_tail: str, ended: bool) -> None:
    request = ParseRequest(chat_template_kwargs=kwargs, enable_auto_tools=True)
    assert _parser(request).reasoning_ended(_ids(prompt_tail)) is ended


def _chunk_contents(chunks: Sequence[Sequence[int]], request: ParseRequest) -> list[str | None]:
    parser = _parser(request)
    state = parser.start([])
    out: list[str | None] = []
    for chunk, text in zip(chunks, g.chunk_texts(MODEL, chunks), strict=True):
        state, events = parser.feed(state, chunk, text)
        parts = [e.text for e in events if isinstance(e, ContentDelta)]
        out.append("".join(parts) if parts else None)
    return out


@needs_shared
def test_empty_content_deltas_follow_vllms_chunk_shape() -> None:
    # vLLM's deepseek_v31 streaming answers every chunk outside a call that holds no call
    # marker with content, even "" (the section markers alone, the stop token): clients see
    # the same chunks. Inside a call, and with tools off, nothing.
    ids = _ids(f"{CALLS_BEGIN}{CALL_BEGIN}a{SEP}1{CALL_END}{CALLS_END}")
    chunks = [[i] for i in ids] + [[]]
    assert _chunk_contents(chunks, AUTO) == ["", None, None, None, None, None, "", ""]
    off = ParseRequest(enable_auto_tools=True)
    assert _chunk_contents([_ids("Hi"), []], off) == ["Hi", None]


def _words() -> st.SearchStrategy[str]:
    return st.text(st.sampled_from(list('ab {}":,\n\\é天🦜<>|')), max_size=12)


_MARKERS = [CALLS_BEGIN, CALLS_END, CALL_BEGIN, CALL_END, SEP, "<think>", "</think>"]


def _oracle(segments: Sequence[str]) -> tuple[str | None, list[tuple[str, str]]]:
    """The documented rules over whole segments (markers or text), written independently."""
    content: list[str] = []
    calls: list[tuple[str, str]] = []
    section = False
    name: str | None = None  # reading a name
    args: str | None = None  # reading arguments
    skip = False
    for seg in segments:
        if not section:
            if seg == CALLS_BEGIN:
                section = True
            else:
                content.append(seg)
            continue
        if seg in (CALLS_END, CALL_BEGIN, CALL_END):
            if args is not None:
                calls[-1] = (calls[-1][0], args)
            name, args, skip = None, None, False
            if seg == CALLS_END:
                section = False
            elif seg == CALL_BEGIN:
                name = ""
            continue
        if skip or seg == CALLS_BEGIN:
            continue
        if name is not None:
            if seg == SEP:
                if name and "\n" not in name and len(name) <= MAX_NAME:
                    calls.append((name, ""))
                    args = ""
                else:
                    skip = True
                name = None
            else:
                name += seg
        elif args is not None:
            args += seg
        else:
            content.append(seg)
    if args is not None:
        calls[-1] = (calls[-1][0], args)
    text = "".join(content)
    return (text or None), calls


@needs_shared
@SETTINGS
@given(
    segments=st.lists(st.one_of(st.sampled_from(_MARKERS), _words()), max_size=25),
    points=st.lists(st.integers(min_value=0, max_value=10_000), max_size=30),
)
# A second section opening inside a call's name is dropped, not a new section.
@example(segments=[CALLS_BEGIN, CALL_BEGIN, CALLS_BEGIN, SEP], points=[])
@example(segments=[CALLS_BEGIN, CALL_BEGIN, "f", CALLS_BEGIN, SEP, "{}", CALLS_BEGIN], points=[])
def test_generated_outputs_any_split(segments: list[str], points: list[int]) -> None:
    ids: list[int] = []
    for seg in segments:
        ids.extend(_ids(seg))
    text = g.tokenizer(MODEL).decode(ids, skip_special_tokens=False)
    parser = _parser(AUTO, reasoning=None)
    whole = g.run(parser, MODEL, [], [ids])
    split = run_roundtrip(parser, MODEL, [], cut(ids, points))
    assert _without_empty(merged(split)) == _without_empty(merged(whole))
    msg = g.accumulate(whole)
    # Segments were encoded one by one, so the decoded text is their concatenation.
    assert text == "".join(segments)
    content, calls = _oracle(segments)
    assert (msg.content or None, msg.calls()) == (content, calls)


def _without_empty(events: list[Event]) -> list[Event]:
    """Empty text deltas follow vLLM's chunk shapes (see above); they carry no text."""
    return [e for e in events if not (isinstance(e, ContentDelta) and not e.text)]


@needs_shared
@pytest.mark.parametrize(
    ("kwargs", "prefix", "filler"),
    [
        ({"thinking": True}, "", " word"),  # reasoning
        ({}, "", " word"),  # content
        ({}, f"{CALLS_BEGIN}{CALL_BEGIN}f{SEP}", " word"),  # arguments
        ({}, f"{CALLS_BEGIN}", " word"),  # between calls
        ({}, f"{CALLS_BEGIN}{CALL_BEGIN}", "ab"),  # an endless name
    ],
)
def test_state_under_1kb_after_10k_chunks(kwargs: dict[str, Any], prefix: str, filler: str) -> None:
    request = ParseRequest(tools=TOOLS, enable_auto_tools=True, chat_template_kwargs=kwargs)
    parser = _parser(request)
    state: ChatState = parser.start(_ids("<｜Assistant｜><think>" if kwargs else "</think>"))
    if prefix:
        state, _ = parser.feed(state, _ids(prefix), prefix)
    filler_ids = _ids(filler)
    assert len(filler_ids) == 1, "the filler must be one token"
    largest = 0
    for _ in range(10_000):
        state, _ = parser.feed(state, filler_ids, filler)
        largest = max(largest, len(STATE_BYTES.encode(state)), len(msgspec.json.encode(state)))
    assert largest < 1024


REFERENCE_TAGS = {
    # vLLM 0.33.0's get_model_structural_tag("deepseek_v3_1", ...) for these requests.
    "named": (
        '{"type": "structural_tag", "format": {"type": "tag", "begin": '
        '"<\\uff5ctool\\u2581calls\\u2581begin\\uff5c><\\uff5ctool\\u2581call\\u2581begin\\uff5c>'
        'get_weather<\\uff5ctool\\u2581sep\\uff5c>", "content": {"type": "json_schema", '
        '"json_schema": true, "style": "json", "any_order": false, "max_whitespace_cnt": null, '
        '"excludes": []}, "end": "<\\uff5ctool\\u2581call\\u2581end\\uff5c>'
        '<\\uff5ctool\\u2581calls\\u2581end\\uff5c>"}}'
    ),
}


def test_structural_tag_for_a_named_tool() -> None:
    request = ParseRequest(
        tools=TOOLS,
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
        enable_auto_tools=True,
    )
    tag = section_structural_tag(request, "auto")
    assert tag == REFERENCE_TAGS["named"]
    assert json.loads(tag or "null")["format"]["begin"].endswith(SEP)


def test_no_structural_tag_for_auto_without_strict_tools() -> None:
    assert section_structural_tag(AUTO, "auto") is None
