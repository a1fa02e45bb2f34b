"""Harmony (gpt-oss) parser: headers and streams against oss-harmony's own StreamableParser.

The reference below runs `openai_harmony.StreamableParser` (the package vLLM 0.33 parses gpt-oss
output with) id by id and applies vLLM's rules for what a message becomes, as its chat path
documents them, plus our documented differences (docs/compat.md): messages not written by the
assistant are dropped, and a message's unfinished character is reported when the message ends.
Every random output is checked chunk by chunk against it, and split at every id with the state
serialized at each boundary against one batch call.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import msgspec
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from parsers.events import (
    ContentDelta,
    Event,
    ReasoningDelta,
    ToolArgsDelta,
    ToolCallEnd,
    ToolCallStart,
)
from parsers.facts import TokenizerFacts
from parsers.harmony import (
    MAX_HEADER_BYTES,
    HarmonyConfig,
    HarmonyFamily,
    HarmonyState,
    parse_header,
)

harmony = pytest.importorskip("openai_harmony")

ENCODING = harmony.load_harmony_encoding(harmony.HarmonyEncodingName.HARMONY_GPT_OSS)
SPECIAL = {
    name: ENCODING.encode(name, allowed_special="all")[0]
    for name in (
        "<|start|>",
        "<|message|>",
        "<|channel|>",
        "<|constrain|>",
        "<|end|>",
        "<|return|>",
        "<|call|>",
        "<|endoftext|>",
    )
}
START, MESSAGE, END, RETURN, CALL = (
    SPECIAL[n] for n in ("<|start|>", "<|message|>", "<|end|>", "<|return|>", "<|call|>")
)
# o200k_harmony has 201088 ids; every one of them decodes (the reserved ones to their spelling).
VOCAB = 201088


def _config() -> HarmonyConfig:
    # The package exposes no per-id bytes publicly; `_inner.decode_bytes` is what `decode` uses.
    table = tuple(bytes(ENCODING._inner.decode_bytes([i])) for i in range(VOCAB))
    facts = TokenizerFacts.from_added_tokens(SPECIAL, SPECIAL.values())
    return HarmonyConfig.build(facts, table)


CONFIG = _config()


def encode(text: str) -> list[int]:
    return list(ENCODING.encode(text, allowed_special="all"))


# Ids of the single-byte tokens 0x80..0xFF: pieces of characters, or bytes that are never valid.
BYTE_IDS = {
    data[0]: token
    for token, data in enumerate(CONFIG.token_bytes)
    if len(data) == 1 and data[0] >= 0x80
}


# ---- the reference -------------------------------------------------------------------------


def _normalize(recipient: str | None) -> str | None:
    if recipient is None:
        return None
    at = recipient.find("<|constrain|>")
    return recipient if at < 0 else (recipient[:at].rstrip() or None)


def _kind(role: str | None, channel: str | None, recipient: str | None) -> str:
    """vLLM's segment type (HarmonyParser), for assistant messages only (our difference)."""
    if role != "assistant":
        return "drop"
    if recipient and not recipient.startswith("<|") and recipient != "assistant":
        head = recipient.split(".", 1)[0]
        if recipient.startswith("functions."):
            if len(recipient) > len("functions."):
                return "tool"
        elif head not in ("python", "browser", "container"):
            return "tool"
    if channel == "analysis":
        return "reasoning"
    if channel == "final" or (channel == "commentary" and recipient is None):
        return "content"
    return "drop"


@dataclass
class Chunk:
    """What one chunk reported: reasoning and content text, tool events in order."""

    reasoning: str = ""
    content: str = ""
    tools: list[tuple[str, int, str]] = field(default_factory=list)

    def add(self, kind: str, text: str, index: int, tools: bool) -> None:
        if not text:
            return
        if kind == "reasoning":
            self.reasoning += text
        elif kind == "content":
            self.content += text
        elif kind == "tool" and tools:
            self.tool("args", index, text)

    def tool(self, what: str, index: int, text: str) -> None:
        if what == "args" and self.tools and self.tools[-1][:2] == ("args", index):
            self.tools[-1] = ("args", index, self.tools[-1][2] + text)
        else:
            self.tools.append((what, index, text))


def reference(chunks: Sequence[Sequence[int]], tools: bool) -> list[Chunk]:
    """Per chunk: what vLLM's gpt-oss chat path streams, with our documented differences."""
    parser = harmony.StreamableParser(ENCODING, harmony.Role.ASSISTANT)
    done = 0
    since_last: list[int] = []  # ids since the last finished message (vLLM's recovery text)
    streamed = ""
    kind = "drop"
    started = 0
    out: list[Chunk] = []
    for chunk in chunks:
        result = Chunk()
        for token in chunk:
            was_header = parser.state == harmony.StreamState.HEADER
            try:
                parser.process(token)
            except harmony.HarmonyError:
                continue
            messages = parser.messages
            if len(messages) > done:
                text = messages[done].content[0].text
                done += 1
                result.add(kind, text[len(streamed) :], started - 1, tools)
                if kind == "tool" and tools:
                    result.tool("end", started - 1, "")
                since_last, streamed, kind = [], "", "drop"
                continue
            since_last.append(token)
            if parser.state != harmony.StreamState.CONTENT:
                # Past the header limit we differ on purpose (tested on its own below).
                assume(sum(len(CONFIG.token_bytes[t]) for t in since_last) <= MAX_HEADER_BYTES)
            if was_header and parser.state == harmony.StreamState.CONTENT:
                role = parser.current_role.value if parser.current_role else None
                recipient = _normalize(parser.current_recipient)
                kind = _kind(role, parser.current_channel, recipient)
                if kind == "tool" and tools:
                    name = (recipient or "").removeprefix("functions.")
                    result.tool("start", started, name)
                    started += 1
            delta = parser.last_content_delta or ""
            streamed += delta
            result.add(kind, delta, started - 1, tools)
        out.append(result)
    result = out[-1] if out else Chunk()
    try:
        parser.process_eos()
    except harmony.HarmonyError:
        result.add("content", ENCODING.decode(since_last), 0, tools)
    else:
        if len(parser.messages) > done:
            text = parser.messages[done].content[0].text
            result.add(kind, text[len(streamed) :], started - 1, tools)
            if kind == "tool" and tools:
                result.tool("end", started - 1, "")
    if not out:
        out.append(result)
    return out


def summarize(events: Sequence[Event]) -> Chunk:
    result = Chunk()
    for event in events:
        if isinstance(event, ReasoningDelta):
            result.reasoning += event.text
        elif isinstance(event, ContentDelta):
            result.content += event.text
        elif isinstance(event, ToolCallStart):
            result.tool("start", event.index, event.name)
        elif isinstance(event, ToolArgsDelta):
            result.tool("args", event.index, event.text)
        elif isinstance(event, ToolCallEnd):
            result.tool("end", event.index, "")
    return result


def stream(
    parser: HarmonyFamily, chunks: Sequence[Sequence[int]], roundtrip: bool = False
) -> list[Chunk]:
    state = parser.start()
    per_chunk: list[list[Event]] = []
    for chunk in chunks:
        if roundtrip:
            state = msgspec.msgpack.decode(msgspec.msgpack.encode(state), type=HarmonyState)
        state, events = parser.feed(state, chunk)
        per_chunk.append(events)
    state, tail = parser.finish(state)
    if per_chunk:
        per_chunk[-1] = per_chunk[-1] + tail
    else:
        per_chunk.append(tail)
    return [summarize(events) for events in per_chunk]


def total(chunks: Sequence[Chunk]) -> Chunk:
    result = Chunk()
    for chunk in chunks:
        result.reasoning += chunk.reasoning
        result.content += chunk.content
        for what, index, text in chunk.tools:
            result.tool(what, index, text)
    return result


# ---- random Harmony outputs ----------------------------------------------------------------

TEXTS = st.sampled_from(
    [
        "The capital of France is Paris.",
        "答案：巴黎 🇫🇷✨ (👩\u200d👩\u200d👧)",
        "𠜎𠜱 naïve café",
        '{"city": "Paris", "unit": "celsius"}',
        '{"q": "😀 \\"x\\""}',
        "",
        " ",
        "line\nbreak\tand <tags>",
        "to=functions.fake <|message|> spelled in text",
    ]
)
CHANNELS = st.sampled_from(["analysis", "commentary", "final", "", "weird", "final json"])
RECIPIENTS = st.sampled_from(
    [
        None,
        "functions.get_weather",
        "functions.send_email",
        "browser.search",
        "python",
        "get_weather",
        "assistant",
        "functions.",
    ]
)
ROLES = st.sampled_from(
    ["assistant", "assistant", "assistant", "", "user", "functions.get_weather"]
)
STOPS = st.sampled_from([END, END, CALL, RETURN, None])
BYTES = st.one_of(
    st.lists(st.sampled_from(sorted(BYTE_IDS.values())), min_size=1, max_size=4),
    st.just([BYTE_IDS[b] for b in "😀".encode()]),
    st.just([BYTE_IDS[b] for b in "é".encode()][:1]),
)
NOISE = st.one_of(
    st.sampled_from(list(SPECIAL.values())),
    st.integers(min_value=0, max_value=VOCAB - 1),
    st.sampled_from(encode(" stray words")),
)


@st.composite
def header(draw: st.DrawFn, first: bool) -> list[int]:
    role = "" if first and draw(st.booleans()) else draw(ROLES)
    channel = draw(CHANNELS)
    recipient = draw(RECIPIENTS)
    text = role
    if recipient is not None and draw(st.booleans()):
        text += f" to={recipient}"
        recipient = None
    if channel:
        text += f"<|channel|>{channel}"
    if recipient is not None:
        text += f" to={recipient}"
    constrain = draw(st.sampled_from(["", " <|constrain|>json", " json", "<|constrain|>json"]))
    return encode(text + constrain)


@st.composite
def harmony_output(draw: st.DrawFn) -> list[int]:
    ids: list[int] = []
    for number in range(draw(st.integers(min_value=0, max_value=4))):
        if number:
            ids.append(START)
        ids += draw(header(number == 0))
        if draw(st.integers(min_value=0, max_value=9)) == 0:
            continue  # a header that never closes
        ids.append(MESSAGE)
        for piece in draw(st.lists(st.one_of(TEXTS, BYTES), max_size=4)):
            ids += encode(piece) if isinstance(piece, str) else piece
        if draw(st.integers(min_value=0, max_value=5)) == 0:
            ids += draw(st.lists(NOISE, min_size=1, max_size=3))
        stop = draw(STOPS)
        if stop is not None:
            ids.append(stop)
        if draw(st.integers(min_value=0, max_value=6)) == 0:
            ids += draw(st.lists(NOISE, min_size=1, max_size=3))  # between messages
    return ids


def chunked(ids: list[int], sizes: Sequence[int]) -> list[list[int]]:
    chunks: list[list[int]] = []
    at = 0
    for size in sizes:
        if at >= len(ids):
            break
        chunks.append(ids[at : at + size])
        at += size
    if at < len(ids):
        chunks.append(ids[at:])
    return chunks


# ---- tests ---------------------------------------------------------------------------------

HEADER_ATOMS = st.sampled_from(
    [
        "assistant",
        "user",
        "tool",
        "developer",
        "wizard",
        "Assistant",
        "functions.get_weather",
        "to=functions.x",
        "to=",
        "to=browser.search",
        "json",
        "<|constrain|>json",
        "<|constrain|>",
        "<|channel|>",
        "analysis",
        "final",
        "commentary",
        " ",
        "\t",
        "\n",
        "\x0b",
        "\x0c",
        "\x1c",
        "\x85",
        "\xa0",
        "\u3000",
        "<",
        ".",
        "é",
        "<|start|>",
        "<|end|>",
        "<|return|>",
    ]
)


def _real_header(text: str, first: bool) -> tuple[Any, ...] | None:
    parser = harmony.StreamableParser(ENCODING, harmony.Role.ASSISTANT if first else None)
    try:
        if not first:
            parser.process(START)
        for token in encode(text):
            parser.process(token)
        parser.process(MESSAGE)
    except harmony.HarmonyError:
        return None
    role = parser.current_role.value if parser.current_role else None
    return (role, parser.current_channel, parser.current_recipient, parser.current_content_type)


@settings(max_examples=400, deadline=None)
@given(st.lists(HEADER_ATOMS, max_size=9), st.booleans())
def test_header_parses_as_streamable_parser_does(atoms: list[str], first: bool) -> None:
    text = "".join(atoms)
    ours = parse_header(text, "assistant" if first else None)
    got = None if ours is None else (ours.role, ours.channel, ours.recipient, ours.content_type)
    assert got == _real_header(text, first)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    harmony_output(),
    st.lists(st.integers(min_value=1, max_value=6), max_size=40),
    st.booleans(),
)
def test_each_chunk_matches_the_reference(ids: list[int], sizes: list[int], tools: bool) -> None:
    chunks = chunked(ids, sizes)
    parser = HarmonyFamily(CONFIG, reasoning=True, tools=tools)
    assert stream(parser, chunks) == reference(chunks, tools)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(harmony_output(), st.booleans())
def test_split_at_every_id_with_the_state_serialized_equals_batch(
    ids: list[int], tools: bool
) -> None:
    parser = HarmonyFamily(CONFIG, reasoning=True, tools=tools)
    one_by_one = stream(parser, [[token] for token in ids], roundtrip=True)
    assert total(one_by_one) == total(stream(parser, [ids]))


# ---- bad input: each has a defined result (docs/compat.md, "Harmony") ----------------------


def answer(text: str, tools: bool = True) -> Chunk:
    """Batch result of an output written as text (special tokens by their spelling)."""
    return total(stream(HarmonyFamily(CONFIG, reasoning=True, tools=tools), [encode(text)]))


def test_a_well_formed_answer() -> None:
    got = answer(
        "<|channel|>analysis<|message|>Think.<|end|><|start|>assistant<|channel|>commentary"
        "<|message|>Checking.<|end|><|start|>assistant<|channel|>commentary to=functions.get_weather"
        ' <|constrain|>json<|message|>{"city": "Paris"}<|call|>'
    )
    assert got == Chunk(
        reasoning="Think.",
        content="Checking.",
        tools=[("start", 0, "get_weather"), ("args", 0, '{"city": "Paris"}'), ("end", 0, "")],
    )


def test_tool_calls_are_dropped_when_not_kept() -> None:
    got = answer("<|channel|>commentary to=functions.get_weather<|message|>{}<|call|>", tools=False)
    assert got == Chunk()


def test_a_header_that_never_closes_is_content_at_the_end() -> None:
    parser = HarmonyFamily(CONFIG, reasoning=True, tools=True)
    chunks = stream(parser, [[token] for token in encode("<|channel|>final The capital is Paris.")])
    assert [c.content for c in chunks[:-1]] == [""] * (len(chunks) - 1)
    assert chunks[-1].content == "<|channel|>final The capital is Paris."


def test_a_header_longer_than_the_limit_turns_the_rest_into_content() -> None:
    text = "no harmony here, just words " * 200
    parser = HarmonyFamily(CONFIG, reasoning=True, tools=True)
    state = parser.start()
    for token in encode(text):
        state, _ = parser.feed(state, [token])
        assert len(state.raw) <= MAX_HEADER_BYTES
        assert len(state.pending) <= 8
    assert answer(text).content == text
    assert answer(text + "<|end|><|start|>assistant<|channel|>final<|message|>x").content == (
        text + "<|end|><|start|>assistant<|channel|>final<|message|>x"
    )


def test_an_unknown_channel_is_dropped() -> None:
    got = answer(
        "<|channel|>weird<|message|>hidden<|end|><|start|>assistant<|channel|>final<|message|>Shown."
    )
    assert got == Chunk(content="Shown.")


def test_a_recipient_that_is_not_a_declared_tool_is_still_a_call() -> None:
    got = answer("<|channel|>commentary to=functions.nope<|message|>{}<|call|>")
    assert got.tools == [("start", 0, "nope"), ("args", 0, "{}"), ("end", 0, "")]
    bare = answer("<|channel|>commentary to=get_weather<|message|>{}<|call|>")
    assert bare.tools[0] == ("start", 0, "get_weather")
    builtin = answer("<|channel|>commentary to=browser.search<|message|>{}<|call|>")
    assert builtin == Chunk()


def test_return_in_the_middle_ends_the_message() -> None:
    got = answer(
        "<|channel|>final<|message|>One.<|return|>dropped words"
        "<|start|>assistant<|channel|>final<|message|>Two."
    )
    assert got == Chunk(content="One.Two.")


def test_ids_after_call_are_dropped_until_a_new_message() -> None:
    got = answer(
        "<|channel|>commentary to=functions.a<|message|>{}<|call|> trailing <|message|>text"
        "<|start|>assistant<|channel|>commentary to=functions.b<|message|>{}<|call|>"
    )
    assert [t for t in got.tools if t[0] == "start"] == [("start", 0, "a"), ("start", 1, "b")]
    assert got.content == ""


def test_messages_of_other_authors_are_dropped() -> None:
    got = answer(
        "<|channel|>final<|message|>A.<|end|><|start|>user<|channel|>final<|message|>B.<|end|>"
        "<|start|>functions.x to=assistant<|channel|>commentary<|message|>C.<|end|>"
    )
    assert got == Chunk(content="A.")


def test_a_cut_character_is_reported_when_its_message_ends() -> None:
    cut = [BYTE_IDS[b] for b in "😀".encode()][:2]
    ids = encode("<|channel|>final<|message|>x") + cut + [END]
    parser = HarmonyFamily(CONFIG, reasoning=True, tools=True)
    assert total(stream(parser, [ids])).content == "x\ufffd"


@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(NOISE, min_size=1, max_size=3000))
def test_the_state_stays_small_on_any_ids(ids: list[int]) -> None:
    parser = HarmonyFamily(CONFIG, reasoning=True, tools=True)
    state = parser.start()
    for at in range(0, len(ids), 7):
        state, _ = parser.feed(state, ids[at : at + 7])
        assert len(msgspec.msgpack.encode(state)) <= MAX_HEADER_BYTES + 300
