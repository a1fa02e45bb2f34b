"""Hypothesis fuzzing of the parsers and the detokenizer with hostile token ids.

Random ids (biased towards each family's marker ids and tool-call-like text), random chunking,
out-of-vocabulary ids: no exception escapes, and the state a stream carries stays small. The
real tokenizers come from ../shared; each case prints hypothesis' seed on failure.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from functools import cache

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from parsers import ChatParser, Detokenizer, ParseRequest, build_chat_parser
from parsers.detokenizer import MAX_HELD_IDS
from tests.parsers import _golden as g

pytestmark = pytest.mark.skipif(not g.shared_present(), reason="../shared is absent")

FUZZ = settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=False
)
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
            },
        },
    }
]
# (model directory, reasoning parser, tool parser): the families the golden corpus covers.
COMBOS = [
    ("qwen3", "qwen3", "hermes"),
    ("qwen3", "qwen3", "qwen3_coder"),
    ("deepseek-r1-distill-qwen", "deepseek_r1", None),
    ("llama-3.1-instruct", None, "llama3_json"),
]
# Text whose pieces look like tool-call syntax, so random sequences reach the deeper states.
SNIPPETS = [
    '{"name": "get_weather", "arguments": {"city": "Paris"}}',
    "<function=get_weather><parameter=city>Paris</parameter></function>",
    '{"name": "get_weather", "parameters": {"days": 3}}; ',
    "\n\n",
    '"}]',
    "Paris 🌧 ",
]
# The stream_state limit of a server: a parser state anywhere near it would be refused.
STATE_BOUND = 4096


@cache
def parser(model: str, reasoning: str | None, tool: str | None) -> ChatParser:
    request = ParseRequest(tools=TOOLS, enable_auto_tools=tool is not None)
    built = build_chat_parser(reasoning, tool, g.facts(model), request)
    assert built is not None
    return built


@cache
def snippet_ids(model: str) -> tuple[int, ...]:
    tok = g.tokenizer(model)
    return tuple(i for s in SNIPPETS for i in tok.encode(s, add_special_tokens=False).ids)


def decode(model: str, ids: Sequence[int]) -> str:
    return str(g.tokenizer(model).decode(list(ids), skip_special_tokens=False))


@st.composite
def id_streams(draw: st.DrawFn, model: str, markers: Sequence[int]) -> list[list[int]]:
    """Chunks of ids mixing markers, tool-call-like pieces and arbitrary vocabulary ids."""
    vocab = g.tokenizer(model).get_vocab_size()
    pieces = snippet_ids(model)
    one = st.one_of(
        st.sampled_from(sorted(markers)),
        st.sampled_from(pieces),
        st.integers(0, vocab - 1),
    )
    ids = draw(st.lists(one, max_size=120))
    cuts = sorted(draw(st.lists(st.integers(0, len(ids)), max_size=12)))
    bounds = [0, *cuts, len(ids)]
    return [ids[a:b] for a, b in itertools.pairwise(bounds)]


@pytest.mark.parametrize(("model", "reasoning", "tool"), COMBOS)
def test_parser_survives_random_ids(model: str, reasoning: str | None, tool: str | None) -> None:
    chat = parser(model, reasoning, tool)

    @FUZZ
    @given(chunks=id_streams(model, chat.marker_ids))
    def run(chunks: list[list[int]]) -> None:
        state = chat.start([])
        for chunk in chunks:
            state, _ = chat.feed(state, chunk, decode(model, chunk))
            assert len(msgspec.msgpack.encode(state)) < STATE_BOUND
        state, _ = chat.finish(state)
        assert len(msgspec.msgpack.encode(state)) < STATE_BOUND

    run()


@pytest.mark.parametrize("model", ["qwen3", "llama-3.1-instruct"])
def test_detokenizer_survives_random_and_unknown_ids(model: str) -> None:
    tok = g.tokenizer(model)
    vocab = tok.get_vocab_size()
    special = g.facts(model).special_ids
    detok = Detokenizer(
        lambda ids: decode(model, ids), special, skip_special_tokens=True, vocab_size=vocab
    )
    # Byte-fallback pieces (lone UTF-8 lead and continuation bytes) make the decoder hold text.
    bytes_ids = [
        i for i in (tok.token_to_id(t) for t in ("Ã", "Â", "Ġ", "ð", "Ł", "¤")) if i is not None
    ]
    any_id = st.one_of(
        st.integers(0, vocab - 1),
        st.integers(-(2**31), 2**31),  # out of vocabulary on both sides: decoded to nothing
        st.sampled_from(bytes_ids or [0]),
    )

    @FUZZ
    @given(
        prompt=st.lists(st.integers(0, vocab - 1), max_size=10),
        chunks=st.lists(st.lists(any_id, max_size=16), max_size=16),
    )
    def run(prompt: list[int], chunks: list[list[int]]) -> None:
        state = detok.start(prompt)
        pieces = []
        for chunk in chunks:
            state, text = detok.step(state, chunk)
            pieces.append(text)
            assert len(state.window) <= 2 * MAX_HELD_IDS + 2
        state, text = detok.finish(state)
        pieces.append(text)
        kept = [i for c in chunks for i in c if 0 <= i < vocab and i not in special]
        # Without a prompt seed the stream's text is what one decode of its kept ids gives.
        if not prompt:
            assert "".join(pieces) == decode(model, kept)

    run()
