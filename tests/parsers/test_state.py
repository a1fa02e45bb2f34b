"""The state stays small however long the stream: it never holds history."""

from __future__ import annotations

import msgspec
import pytest

from parsers import ChatState, ParseRequest, build_chat_parser
from tests.parsers import _golden as g

needs_shared = pytest.mark.skipif(not g.shared_present(), reason="../shared is absent")
TOOLS = [{"type": "function", "function": {"name": "f", "parameters": {}}}]
N = 10_000


def _max_state_bytes(prefix: str, filler: str, parser_names: tuple[str | None, str | None]) -> int:
    tok = g.tokenizer("qwen3")
    request = ParseRequest(tools=TOOLS, enable_auto_tools=True)
    facts = g.facts("deepseek-r1-distill-qwen" if parser_names[0] == "deepseek_r1" else "qwen3")
    parser = build_chat_parser(*parser_names, facts, request)
    assert parser is not None
    state = parser.start([])
    if prefix:
        head = tok.encode(prefix, add_special_tokens=False).ids
        state, _ = parser.feed(state, head, prefix)
    filler_ids = tok.encode(filler, add_special_tokens=False).ids
    assert len(filler_ids) == 1, "the filler must be one token"
    largest = 0
    for _ in range(N):
        state, _ = parser.feed(state, filler_ids, filler)
        largest = max(largest, len(msgspec.msgpack.encode(state)), len(msgspec.json.encode(state)))
    return largest


@needs_shared
@pytest.mark.parametrize(
    ("prefix", "filler"),
    [
        ("<think>", " word"),  # reasoning
        ("<think>x</think>", " word"),  # content
        ('<tool_call>{"name": "f", "arguments": {"k": "', " word"),  # inside a string argument
        ('<tool_call>{"name": "f", "arguments": [', "[["),  # ever deeper nesting
    ],
)
def test_state_under_1kb_after_10k_tokens(prefix: str, filler: str) -> None:
    assert _max_state_bytes(prefix, filler, ("qwen3", "hermes")) < 1024


@needs_shared
@pytest.mark.parametrize(
    ("prefix", "filler", "names"),
    [
        ("", " word", ("deepseek_r1", None)),  # R1 reasoning (the prompt pre-opens it)
        ("<tool_call>\n<function=f>\n<parameter=k>\n", " word", (None, "qwen3_coder")),
        ("<tool_call>\n<function=f>\n<parameter=k>\n", "<", (None, "qwen3_coder")),
    ],
)
def test_other_families_state_bounded(
    prefix: str, filler: str, names: tuple[str | None, str | None]
) -> None:
    assert _max_state_bytes(prefix, filler, names) < 1024


def test_state_round_trips() -> None:
    state = ChatState(phase=0, reasoning_emitted=True, tools_started=3)
    assert msgspec.json.decode(msgspec.json.encode(state), type=ChatState) == state
    assert msgspec.msgpack.decode(msgspec.msgpack.encode(state), type=ChatState) == state


@needs_shared
def test_tools_emitted_recorded() -> None:
    tok = g.tokenizer("qwen3")
    text = '<tool_call>{"name": "f", "arguments": {}}</tool_call>'
    ids = tok.encode(text, add_special_tokens=False).ids
    parser = build_chat_parser(
        None, "hermes", g.facts("qwen3"), ParseRequest(tools=TOOLS, enable_auto_tools=True)
    )
    assert parser is not None
    state = parser.start([])
    assert not state.tools_emitted
    state, _ = parser.feed(state, ids, tok.decode(ids, skip_special_tokens=False))
    assert state.tools_emitted
