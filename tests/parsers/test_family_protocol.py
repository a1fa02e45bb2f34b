"""The family hooks of parsers/family.py, each driven through ChatParser by a small family.

The families here are written for the test (a section of several calls with inner markers,
an answer-mode scanner, reasoning switched off per request, reasoning reported as content, a
whole-output chat family), so the machine is checked against every hook a coming format needs
without a model. Their states are not registered, so they are not round-tripped here
(test_registry.py round-trips every registered family's state).
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import combinations
from typing import ClassVar

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from parsers import (
    ChatParser,
    ContentDelta,
    Event,
    ParseRequest,
    ReasoningDelta,
    RenderAdjustments,
    ToolArgsDelta,
    ToolCallEnd,
    ToolCallStart,
    tool_call_id,
)
from parsers.family import (
    ChatFamily,
    Family,
    FamilyState,
    Marker,
    ReasoningFamily,
    ToolFamily,
    _last_indices,
)
from tests.parsers import _golden as g

THINK, END_THINK = 1, 2
CALLS, END_CALLS, CALL, SEP, END_CALL = 10, 11, 12, 13, 14
OPEN, CLOSE = 20, 21
TEXT = 0  # the id every plain-text piece gets
SPELLING = {
    THINK: "<think>",
    END_THINK: "</think>",
    CALLS: "<calls>",
    END_CALLS: "</calls>",
    CALL: "<call>",
    SEP: "<sep>",
    END_CALL: "</call>",
    OPEN: "<t>",
    CLOSE: "</t>",
}
TOOLS = [{"type": "function", "function": {"name": "f"}}]
REQUEST = ParseRequest(tools=TOOLS, enable_auto_tools=True)

Piece = int | str  # a marker id, or plain text


class SectionState(FamilyState, frozen=True, tag="test_section"):
    index: int
    in_call: bool = False
    name: str = ""
    named: bool = False


class SectionTools(ToolFamily, frozen=True):
    """`<calls><call>NAME<sep>ARGS</call>...</calls>`: one section, several calls."""

    drops_text_after_calls: ClassVar[bool] = False
    swallows_inactive_markup: ClassVar[bool] = True
    default_strict_level: ClassVar[str] = "function"

    def markers(self) -> tuple[Marker, ...]:
        inner = tuple(Marker(i, SPELLING[i], "inner") for i in (CALL, SEP, END_CALL))
        return (Marker(CALLS, "<calls>", "start"), Marker(END_CALLS, "</calls>", "end"), *inner)

    def begin(self, index: int) -> SectionState:
        return SectionState(index)

    def feed(self, call: FamilyState, text: str) -> tuple[FamilyState, list[Event]]:
        assert isinstance(call, SectionState)
        if not call.in_call:
            return call, []
        if call.named:
            return call, [ToolArgsDelta(call.index, text)]
        return msgspec.structs.replace(call, name=call.name + text), []

    def marker(
        self, call: FamilyState, token_id: int, text: str
    ) -> tuple[FamilyState, list[Event]]:
        assert isinstance(call, SectionState)
        if token_id == CALL:
            return SectionState(call.index, in_call=True), []
        if token_id == SEP and call.in_call and not call.named:
            return msgspec.structs.replace(call, named=True), [ToolCallStart(call.index, call.name)]
        if token_id == END_CALL and call.named:
            return SectionState(call.index + 1), [ToolCallEnd(call.index)]
        return call, []

    def close(self, call: FamilyState) -> list[Event]:
        assert isinstance(call, SectionState)
        return [ToolCallEnd(call.index)] if call.named else []

    def structural_tag(self, request: ParseRequest, strict_level: str) -> str | None:
        return f"section:{strict_level}"

    def call_id(self, request_id: str, choice_index: int, tool_index: int) -> str:
        return f"{request_id}.{choice_index}.{tool_index}"


class KeepingSectionTools(SectionTools, frozen=True):
    """The same format where markup and text after calls are content."""

    drops_text_after_calls: ClassVar[bool] = True
    swallows_inactive_markup: ClassVar[bool] = False


class ReasoningAwareTools(SectionTools, frozen=True):
    """Keeps markup as content under the reasoning family named "keep" (as MiniMax does)."""

    def bind(self, request: ParseRequest, reasoning: ReasoningFamily | None) -> ToolFamily:
        if reasoning is not None and reasoning.family == "keep":
            return KeepingSectionTools()
        return self


class AnswerState(FamilyState, frozen=True, tag="test_answer"):
    index: int
    name: str = ""
    in_call: bool = False


class AnswerTools(ToolFamily, frozen=True):
    """The answer goes through the family (upper-cased), and `<t>NAME</t>` is a call."""

    def markers(self) -> tuple[Marker, ...]:
        return (Marker(OPEN, "<t>", "start"), Marker(CLOSE, "</t>", "end"))

    def begin(self, index: int) -> AnswerState:
        return AnswerState(index, in_call=True)

    def begin_answer(self, index: int) -> AnswerState:
        return AnswerState(index)

    def feed(self, call: FamilyState, text: str) -> tuple[FamilyState, list[Event]]:
        assert isinstance(call, AnswerState)
        if call.in_call:
            return msgspec.structs.replace(call, name=call.name + text), []
        return call, [ContentDelta(text.upper())]

    def close(self, call: FamilyState) -> list[Event]:
        assert isinstance(call, AnswerState)
        if not call.in_call:
            return []
        return [ToolCallStart(call.index, call.name), ToolCallEnd(call.index)]

    def reasoning_ended(self, request: ParseRequest) -> bool | None:
        return True  # as if the family's grammar covered reasoning


def think(**switches: bool) -> ReasoningFamily:
    return ReasoningFamily("test", THINK, "<think>", END_THINK, "</think>", **switches)


class ThinkingSwitch(ReasoningFamily, frozen=True):
    """Reasoning only when `chat_template_kwargs.thinking` is true (else vLLM's identity)."""

    def bind(self, request: ParseRequest) -> ReasoningFamily | None:
        return self if request.chat_template_kwargs.get("thinking") else None

    def thinking_enabled(self, chat_template_kwargs: dict[str, object]) -> bool:
        return bool(chat_template_kwargs.get("thinking"))

    def reasoning_ended(self, request: ParseRequest, prompt_token_ids: Sequence[int]) -> bool:
        if not request.chat_template_kwargs.get("thinking"):
            return True
        return super().reasoning_ended(request, prompt_token_ids)


class AppendThink(ReasoningFamily, frozen=True):
    """Reasoning kept in the content, `<think>` and `</think>` included."""

    def text_event(self, text: str, first: bool) -> Event:
        return ContentDelta(("<think>" if first else "") + text)

    def empty_event(self) -> Event | None:
        return ContentDelta("<think>")

    def end_event(self) -> Event | None:
        return ContentDelta("</think>")


class EchoState(FamilyState, frozen=True, tag="test_echo"):
    calls: int = 0


class EchoChat(ChatFamily, frozen=True):
    """Every id 7 is a call of `f`; all other text is content."""

    with_tools: bool = False

    def bind(
        self, request: ParseRequest, reasoning: Family | None, tools: Family | None
    ) -> ChatFamily:
        return EchoChat(with_tools=tools is not None)

    def marker_ids(self) -> frozenset[int]:
        return frozenset({7})

    def start(self, prompt_token_ids: Sequence[int]) -> EchoState:
        return EchoState()

    def feed(
        self, state: FamilyState, token_ids: Sequence[int], text: str
    ) -> tuple[FamilyState, list[Event]]:
        assert isinstance(state, EchoState)
        events: list[Event] = [ContentDelta(text)] if text else []
        calls = state.calls
        for token_id in token_ids:
            if token_id == 7:
                events += [ToolCallStart(calls, "f"), ToolCallEnd(calls)]
                calls += 1
        return EchoState(calls), events

    def finish(self, state: FamilyState) -> tuple[FamilyState, list[Event]]:
        return state, [ContentDelta("." if self.with_tools else "!")]

    def reasoning_ended(self, prompt_token_ids: Sequence[int]) -> bool | None:
        return False

    def render_adjustments(self, strict_level: str) -> RenderAdjustments:
        return RenderAdjustments(skip_special_tokens=False, structural_tag=strict_level)

    def call_id(self, request_id: str, choice_index: int, tool_index: int) -> str:
        return f"echo-{tool_index}"


def parse(
    parser: ChatParser, chunks: Sequence[Sequence[Piece]], prompt: Sequence[int] = ()
) -> list[Event]:
    state = parser.start(prompt)
    events: list[Event] = []
    for chunk in chunks:
        ids = [p if isinstance(p, int) else TEXT for p in chunk]
        text = "".join(SPELLING[p] if isinstance(p, int) else p for p in chunk)
        state, new = parser.feed(state, ids, text)
        events += new
    state, new = parser.finish(state)
    return events + new


def message(events: Sequence[Event]) -> tuple[str | None, str | None, list[tuple[str, str]]]:
    msg = g.accumulate(events)
    assert msg.ended == set(msg.tool_calls), "every started call ends"
    return msg.reasoning, msg.content, msg.calls()


SECTION: list[Piece] = [
    "Sure.",
    CALLS,
    CALL,
    "f",
    SEP,
    '{"a": 1}',
    END_CALL,
    "\n",
    CALL,
    "g",
    SEP,
    "{}",
    END_CALL,
    END_CALLS,
    " Done.",
]


def test_one_section_holds_several_calls_numbered_by_the_machine() -> None:
    parser = ChatParser.build(None, SectionTools(), REQUEST)
    events = parse(parser, [SECTION])
    assert message(events) == (None, "Sure. Done.", [("f", '{"a": 1}'), ("g", "{}")])
    starts = [e for e in events if isinstance(e, ToolCallStart)]
    assert [e.index for e in starts] == [0, 1]


def test_a_section_gives_the_same_events_for_every_chunking() -> None:
    parser = ChatParser.build(None, SectionTools(), REQUEST)
    whole = message(parse(parser, [SECTION]))
    for a, b in combinations(range(1, len(SECTION)), 2):
        chunks = [SECTION[:a], SECTION[a:b], SECTION[b:]]
        assert message(parse(parser, chunks)) == whole, (a, b)


def test_inner_markers_outside_their_section_are_text() -> None:
    parser = ChatParser.build(think(), SectionTools(), REQUEST)
    events = parse(parser, [["x", CALL, "y", END_THINK, "a", SEP, "b"]])
    assert message(events) == ("x<call>y", "a<sep>b", [])


def test_markup_is_swallowed_while_tools_are_off_when_the_family_says_so() -> None:
    off = ParseRequest(tools=TOOLS, tool_choice="none", enable_auto_tools=True)
    swallowing = ChatParser.build(None, SectionTools(), off)
    assert message(parse(swallowing, [SECTION])) == (None, "Sure. Done.", [])
    keeping = ChatParser.build(None, KeepingSectionTools(), off)
    content = 'Sure.<calls><call>f<sep>{"a": 1}</call>\n<call>g<sep>{}</call></calls> Done.'
    assert message(parse(keeping, [SECTION])) == (None, content, [])


def test_a_tool_family_adapts_to_the_configured_reasoning_family() -> None:
    off = ParseRequest(tools=TOOLS, tool_choice="none", enable_auto_tools=True)
    keep = ReasoningFamily("keep", THINK, "<think>", END_THINK, "</think>")
    kept = ChatParser.build(keep, ReasoningAwareTools(), off)
    swallowed = ChatParser.build(think(), ReasoningAwareTools(), off)
    assert isinstance(kept.tools, KeepingSectionTools)
    assert message(parse(kept, [SECTION], [END_THINK]))[1] == "".join(
        SPELLING[p] if isinstance(p, int) else p for p in SECTION
    )
    assert message(parse(swallowed, [SECTION], [END_THINK]))[1] == "Sure. Done."


def test_text_after_calls_is_content_unless_the_family_drops_it() -> None:
    kept = ChatParser.build(None, SectionTools(), REQUEST)
    dropped = ChatParser.build(None, KeepingSectionTools(), REQUEST)
    assert message(parse(kept, [SECTION]))[1] == "Sure. Done."
    assert message(parse(dropped, [SECTION]))[1] == "Sure."


class EveryChunkTools(SectionTools, frozen=True):
    """Answers each chunk outside a call that holds no call marker with content, even ""."""

    def chunk_content(self, began_in: FamilyState | None, token_ids: Sequence[int]) -> bool:
        in_call = isinstance(began_in, SectionState) and began_in.in_call
        return not in_call and CALL not in token_ids and END_CALL not in token_ids


def chunk_contents(parser: ChatParser, chunks: Sequence[Sequence[Piece]]) -> list[str | None]:
    """The content each chunk reports (None: no content delta)."""
    state = parser.start(())
    out: list[str | None] = []
    for chunk in chunks:
        ids = [p if isinstance(p, int) else TEXT for p in chunk]
        text = "".join(SPELLING[p] if isinstance(p, int) else p for p in chunk)
        state, events = parser.feed(state, ids, text)
        parts = [e.text for e in events if isinstance(e, ContentDelta)]
        out.append("".join(parts) if parts else None)
    return out


def test_a_tool_family_can_answer_every_chunk_with_content() -> None:
    chunks: list[list[Piece]] = [[CALLS], [CALL], ["f"], [SEP], ["1"], [END_CALL], [END_CALLS], []]
    shaped = ChatParser.build(None, EveryChunkTools(), REQUEST)
    assert chunk_contents(shaped, chunks) == ["", None, None, None, None, None, "", ""]
    assert chunk_contents(ChatParser.build(None, SectionTools(), REQUEST), chunks) == [None] * 8
    off = ParseRequest(tools=TOOLS, tool_choice="none", enable_auto_tools=True)
    assert chunk_contents(ChatParser.build(None, EveryChunkTools(), off), [["a"], []]) == [
        "a",
        None,
    ]


@pytest.mark.parametrize("answer_side", [True, False])
def test_legacy_empty_deltas_on_the_answer_side_can_be_left_out(answer_side: bool) -> None:
    family = think(empty_deltas=True, answer_empty_deltas=answer_side)
    parser = ChatParser.build(family, None, ParseRequest())
    state = parser.start([THINK])
    state, in_reasoning = parser.feed(state, [], "")
    state, crossing = parser.feed(state, [END_THINK, TEXT], "</think>a")
    state, in_answer = parser.feed(state, [], "")
    assert in_reasoning == [ReasoningDelta("")]
    expected_crossing: list[Event] = [ContentDelta("a")]
    if answer_side:
        expected_crossing.insert(0, ReasoningDelta(""))
    assert crossing == expected_crossing
    assert in_answer == ([ContentDelta("")] if answer_side else [])


def test_strict_level_defaults_to_the_family_and_the_server_flag_wins() -> None:
    assert ChatParser.build(None, SectionTools(), REQUEST).structural_tag() == "section:function"
    explicit = ChatParser.build(None, SectionTools(), REQUEST, "parameter")
    assert explicit.structural_tag() == "section:parameter"
    assert ChatParser.build(None, AnswerTools(), REQUEST).tool_strict_level == "auto"


def test_call_ids_follow_the_family_format() -> None:
    assert ChatParser.build(None, SectionTools(), REQUEST).tool_call_id("r", 0, 1) == "r.0.1"
    default = ChatParser.build(None, AnswerTools(), REQUEST)
    assert default.tool_call_id("r", 0, 1) == tool_call_id("r", 0, 1)
    assert ChatParser.build(think(), None, REQUEST).tool_call_id("r", 2, 3) == tool_call_id(
        "r", 2, 3
    )


def test_answer_mode_reads_the_answer_and_resumes_after_each_call() -> None:
    parser = ChatParser.build(think(), AnswerTools(), REQUEST)
    events = parse(parser, [["hm", END_THINK, "a", OPEN, "f", CLOSE, "b", OPEN, "g"]])
    assert message(events) == ("hm", "AB", [("f", ""), ("g", "")])
    off = ChatParser.build(None, AnswerTools(), ParseRequest(enable_auto_tools=True))
    assert message(parse(off, [["a", OPEN, "f", CLOSE]])) == (None, "a<t>f</t>", [])


def test_a_tool_family_can_declare_reasoning_ended() -> None:
    parser = ChatParser.build(think(), AnswerTools(), REQUEST)
    assert parser.reasoning_ended([THINK]) is True
    assert ChatParser.build(think(), None, REQUEST).reasoning_ended([THINK]) is False


@pytest.mark.parametrize("thinking", [True, False])
def test_reasoning_switched_off_per_request(thinking: bool) -> None:
    request = ParseRequest(chat_template_kwargs={"thinking": thinking})
    family = ThinkingSwitch("test", THINK, "<think>", END_THINK, "</think>")
    parser = ChatParser.build(family, None, request)
    events = parse(parser, [["r", END_THINK, "a"]], prompt=[THINK])
    if thinking:
        assert parser.reasoning is family
        assert message(events) == ("r", "a", [])
        assert parser.reasoning_ended([THINK]) is False
    else:
        assert parser.reasoning is None
        assert message(events) == (None, "r</think>a", [])
        assert parser.reasoning_ended([THINK]) is True


@pytest.mark.parametrize("include_reasoning", [True, False])
def test_reasoning_reported_as_content(include_reasoning: bool) -> None:
    family = AppendThink("test", THINK, "<think>", END_THINK, "</think>")
    parser = ChatParser.build(family, None, ParseRequest(include_reasoning=include_reasoning))
    events = parse(parser, [["r1", " r2"], [END_THINK, "a"]], prompt=[THINK])
    assert message(events) == (None, "<think>r1 r2</think>a", [])
    assert message(parse(parser, [[]], prompt=[THINK])) == (None, "<think>", [])
    assert message(parse(parser, [[END_THINK]], prompt=[THINK])) == (None, "<think></think>", [])


def test_reasoning_hooks_default_to_the_switches() -> None:
    plain, reporting = think(), think(report_empty_reasoning=True)
    assert plain.text_event("x", True) == ReasoningDelta("x")
    assert (plain.empty_event(), reporting.empty_event()) == (None, ReasoningDelta(""))
    assert plain.end_event() is None
    assert think(keeps_special_tokens=True).render_adjustments(REQUEST) == RenderAdjustments(
        skip_special_tokens=False
    )


@pytest.mark.parametrize("side", ["reasoning", "tools"])
def test_a_chat_family_replaces_the_machine(side: str) -> None:
    chat = EchoChat()
    if side == "reasoning":
        parser = ChatParser.build(chat, SectionTools(), REQUEST, "function")
    else:
        parser = ChatParser.build(think(), chat, REQUEST, "function")
    state = parser.start([1, 2])
    state, first = parser.feed(state, [5, 7], "hi")
    state, second = parser.feed(state, [7], "")
    state, last = parser.finish(state)
    assert state.tools_emitted and state.tools_started == 2
    assert state.call == EchoState(2)
    assert message(first + second + last) == (None, "hi.", [("f", ""), ("f", "")])
    assert parser.marker_ids == frozenset({7})
    assert parser.tool_call_id("r", 0, 1) == "echo-1"
    assert parser.reasoning is None and parser.tools is None
    assert parser.reasoning_ended([1]) is False
    assert parser.render_adjustments() == RenderAdjustments(False, "function")


def test_a_chat_family_without_tools_and_without_reasoning() -> None:
    parser = ChatParser.build(EchoChat(), None, ParseRequest(include_reasoning=False))
    assert message(parse(parser, [["x"]])) == (None, "x!", [])
    assert parser.reasoning_ended([1]) is True  # include_reasoning false: always ended


_IDS = st.lists(
    st.one_of(
        st.sampled_from([0, 1, 5, 256, 257, 65536, 65537, 1 << 24, (1 << 24) | 5, 2**32 - 1]),
        st.integers(0, 2**32 - 1),
    ),
    max_size=40,
)


@settings(max_examples=500, deadline=None)
@given(
    st.one_of(_IDS, _IDS.map(lambda ids: [*ids, -1]), _IDS.map(lambda ids: [*ids, 2**40])),
    st.lists(
        st.one_of(st.none(), st.sampled_from([0, 1, 5, 256, 65537, 2**32 - 1, -1])), max_size=3
    ),
)
def test_last_indices_are_the_last_positions_of_each_id(
    ids: list[int], token_ids: list[int | None]
) -> None:
    """The byte search over packed ids (misaligned matches skipped) finds what a scan finds;
    ids that do not fit 32 bits take the list's own search."""
    expected = [
        max((i for i, x in enumerate(ids) if x == t), default=-1) if t is not None else -1
        for t in token_ids
    ]
    assert _last_indices(ids, tuple(token_ids)) == expected
