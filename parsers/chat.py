"""`ChatParser`: reasoning phase, then answer and tool calls, as a value-in value-out machine.

The machine knows no family: it routes marker tokens and text to the configured
`ReasoningFamily` and `ToolFamily` through their hooks, or hands the whole output to a
`ChatFamily` (see `parsers/family.py`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, TypeAlias

import msgspec

from parsers import registry
from parsers._segments import split_at_markers
from parsers.events import ContentDelta, Event, ReasoningDelta, ToolArgsDelta, ToolCallStart
from parsers.facts import TokenizerFacts
from parsers.family import ChatFamily, FamilyState, ReasoningFamily, ToolFamily
from parsers.ids import tool_call_id
from parsers.message import Message, accumulate, batch_message
from parsers.request import ParseRequest
from parsers.structural_tag import RenderAdjustments

__all__ = ["ChatParser", "ChatState", "build_chat_parser"]

REASONING = 0
CONTENT = 1
IN_TOOL_CALL = 2

# Engine families hold leading whitespace-only content; past this many chars it is sent.
_MAX_HELD_SPACE = 1024

# Marker kinds.
_THINK_START = 0
_THINK_END = 1
_TOOL_START = 2
_TOOL_END = 3
_TOOL_INNER = 4
_TOOL_KINDS = {"start": _TOOL_START, "end": _TOOL_END, "inner": _TOOL_INNER}

if TYPE_CHECKING:
    CallState: TypeAlias = FamilyState
else:
    # Every registered family's state type: a family is decoded by its tag, so adding a
    # registry row is all it takes for its state to travel in the stream state.
    CallState = registry.state_union()


class ChatState(msgspec.Struct, frozen=True, gc=False, array_like=True):
    """Everything a stream needs between chunks; never the history.

    Serializable with msgspec json and msgpack. New fields go last, with defaults.
    """

    phase: int = CONTENT
    #: Any reasoning text emitted (or reported empty) so far.
    reasoning_emitted: bool = False
    #: A tool-call start token was seen: plain text after it is not content (vLLM drops it).
    tool_seen: bool = False
    #: Tool calls started so far (the next call's index).
    tools_started: int = 0
    #: The tool family's open state (a call, a section or the answer), or a chat family's state.
    call: CallState | None = None
    #: Engine families: content other than whitespace was sent (later whitespace flows freely).
    answer_text: bool = False
    #: Engine families: whitespace-only content held until text follows (dropped once a call
    #: starts, sent at the end when none did).
    held_space: str = ""
    #: Length of the reasoning so far while it is only whitespace (-1 once it has text).
    lead_space: int = 0
    #: Whitespace-only reasoning before a start marker that reasoning absorbed (the batch answer
    #: drops it where vLLM's batch does, see `ReasoningFamily.batch_drops_space_before_start`).
    reasoning_lead: int = 0

    @property
    def tools_emitted(self) -> bool:
        """Whether any tool call was emitted (finish_reason "tool_calls")."""
        return self.tools_started > 0


class ChatParser(msgspec.Struct, frozen=True):
    """Configuration only: reasoning family, tool family, the request and marker ids.

    `start`, `feed` and `finish` take a `ChatState` and return a new one with the events;
    feeding a chunk costs O(chunk), whatever came before.
    """

    #: The reasoning family for this request (None: no reasoning section is parsed).
    reasoning: ReasoningFamily | None
    #: The tool family bound to this request (None: tool markup is text).
    tools: ToolFamily | None
    request: ParseRequest
    #: Marker token id -> (kind, spelling).
    markers: dict[int, tuple[int, str]]
    #: Marker token id -> spelling, for splitting chunks.
    spellings: dict[int, str]
    #: Whether tool markup is parsed into calls (a tool parser, tools, tool_choice not "none").
    tools_active: bool
    #: vLLM's `--tool-strict-level`: "auto", "function" or "parameter".
    tool_strict_level: str = "auto"
    #: The configured reasoning family even when `bind` turned it off for this request.
    reasoning_parser: ReasoningFamily | None = None
    #: A family that parses the whole output itself; the fields above are then unused.
    chat: ChatFamily | None = None

    @classmethod
    def build(
        cls,
        reasoning: ReasoningFamily | ChatFamily | None,
        tools: ToolFamily | ChatFamily | None,
        request: ParseRequest,
        tool_strict_level: str | None = None,
    ) -> ChatParser:
        """Combine a reasoning and a tool family for one request.

        `tools` counts only when tool calls are parsed at all (vLLM's
        `--enable-auto-tool-choice`); a None `tool_strict_level` takes the family's default.
        """
        if isinstance(reasoning, ChatFamily):
            return cls._whole(reasoning, reasoning, tools, request, tool_strict_level)
        if isinstance(tools, ChatFamily):
            return cls._whole(tools, reasoning, tools, request, tool_strict_level)
        markers: dict[int, tuple[int, str]] = {}
        configured = reasoning
        if tools is not None:
            tools = tools.bind(request, configured)
            for marker in tools.markers():
                markers[marker.token_id] = (_TOOL_KINDS[marker.role], marker.text)
        if reasoning is not None:
            reasoning = reasoning.bind(request)
        if reasoning is not None:
            markers[reasoning.start_id] = (_THINK_START, reasoning.start_text)
            markers[reasoning.end_id] = (_THINK_END, reasoning.end_text)
            if reasoning.tool_start_ends_reasoning and reasoning.tool_start_id is not None:
                markers.setdefault(
                    reasoning.tool_start_id, (_TOOL_START, reasoning.tool_start_text)
                )
        active = (
            tools is not None
            and request.enable_auto_tools
            and bool(request.tools)
            and request.effective_tool_choice != "none"
        )
        spellings = {tid: spelling for tid, (_, spelling) in markers.items()}
        level = tool_strict_level or (tools.default_strict_level if tools else "auto")
        return cls(
            reasoning,
            tools,
            request,
            markers,
            spellings,
            active,
            level,
            reasoning_parser=configured,
        )

    @classmethod
    def _whole(
        cls,
        chat: ChatFamily,
        reasoning: ReasoningFamily | ChatFamily | None,
        tools: ToolFamily | ChatFamily | None,
        request: ParseRequest,
        tool_strict_level: str | None,
    ) -> ChatParser:
        """A parser that hands the whole output to `chat`."""
        level = tool_strict_level or chat.default_strict_level
        bound = chat.bind(request, reasoning, tools)
        return cls(None, None, request, {}, {}, False, level, chat=bound)

    @property
    def marker_ids(self) -> frozenset[int]:
        """Ids this parser treats as markers; a caller may split chunks at them."""
        if self.chat is not None:
            return self.chat.marker_ids()
        return frozenset(self.markers)

    def reasoning_ended(self, prompt_token_ids: Sequence[int]) -> bool | None:
        """What vLLM 0.33's render puts in `reasoning_ended` for this prompt."""
        if not self.request.include_reasoning:
            return True
        if self.chat is not None:
            return self.chat.reasoning_ended(prompt_token_ids)
        forced = self.tools.reasoning_ended(self.request) if self.tools is not None else None
        if forced is not None:
            return forced
        if self.reasoning_parser is None:
            return None
        return self.reasoning_parser.reasoning_ended(self.request, prompt_token_ids)

    def render_adjustments(self) -> RenderAdjustments:
        """How render must change the request's sampling params (vLLM's adjust_request)."""
        if self.chat is not None:
            return self.chat.render_adjustments(self.tool_strict_level)
        adjustments = RenderAdjustments()
        if self.reasoning_parser is not None:
            adjustments = self.reasoning_parser.render_adjustments(self.request)
        if self.tools is not None:
            more = self.tools.render_adjustments(self.request, self.tool_strict_level)
            adjustments = adjustments.merge(more)
        return adjustments

    def structural_tag(self) -> str | None:
        """The exact `structured_outputs.structural_tag` vLLM 0.33 renders, or None."""
        return self.render_adjustments().structural_tag

    def tool_call_id(self, request_id: str, choice_index: int, tool_index: int) -> str:
        """The id of call `tool_index` of a choice, in the family's format (deterministic)."""
        family = self.chat or self.tools
        if family is None:
            return tool_call_id(request_id, choice_index, tool_index)
        return family.call_id(request_id, choice_index, tool_index)

    def parse_batch(
        self, prompt_token_ids: Sequence[int], token_ids: Sequence[int], text: str
    ) -> Message:
        """The batch answer for a whole output: the stream accumulated, then `batch_message`."""
        state = self.start(prompt_token_ids)
        state, events = self.feed(state, token_ids, text)
        state, more = self.finish(state)
        return self.batch_answer(
            events + more,
            state,
            lambda: self.without_tools().parse_whole(prompt_token_ids, token_ids, text),
        )

    def batch_answer(
        self, events: list[Event], end: ChatState, as_written: Callable[[], Message]
    ) -> Message:
        """The batch answer from a whole output's events and the parser's state at its end.

        `as_written` parses the same output with tool calling off (`without_tools`); it is
        called only when the batch rule needs it.
        """
        calls = self.tools or self.chat
        return batch_message(
            accumulate(events),
            engine=calls is not None and calls.engine,
            forced_tool_choice=self.request.effective_tool_choice in ("required", "named"),
            reasoning_family=self.reasoning is not None or self.chat is not None,
            as_written=as_written,
            reasoning_lead=end.reasoning_lead,
            validates_arguments=calls is None or calls.validates_arguments,
        )

    def parse_whole(
        self, prompt_token_ids: Sequence[int], token_ids: Sequence[int], text: str
    ) -> Message:
        """A whole output through `start`/`feed`/`finish`, accumulated as a client would."""
        state = self.start(prompt_token_ids)
        state, events = self.feed(state, token_ids, text)
        _, more = self.finish(state)
        return accumulate(events + more)

    def without_tools(self) -> ChatParser:
        """This parser with tool calling off: tool markup reads as content, as written."""
        return msgspec.structs.replace(self, tools_active=False)

    def start(self, prompt_token_ids: Sequence[int]) -> ChatState:
        """Initial state: inside reasoning unless the prompt or the template switches closed it."""
        if self.chat is not None:
            return ChatState(call=self.chat.start(prompt_token_ids))
        reasoning = self.reasoning
        if (
            reasoning is None
            or not reasoning.thinking_enabled(self.request.chat_template_kwargs)
            or reasoning.reasoning_ended(self.request, prompt_token_ids)
        ):
            return self._answer(ChatState(phase=CONTENT))
        return ChatState(phase=REASONING)

    def feed(
        self, state: ChatState, token_ids: Sequence[int], text: str
    ) -> tuple[ChatState, list[Event]]:
        """Parse one chunk: `text` is the decode of exactly `token_ids`, special tokens kept."""
        if self.chat is not None:
            return self._chat_step(
                state, self.chat.feed(self._chat_state(self.chat, state), token_ids, text)
            )
        events: list[Event] = []
        phase = state.phase
        began_in = state.call
        for marker, piece in split_at_markers(token_ids, text, self.spellings):
            if marker is None:
                state = self._text(state, piece, events)
            else:
                if (
                    phase == REASONING
                    and state.phase == REASONING
                    and self._legacy_end(marker)
                    and len(token_ids) > 1
                    and not any(isinstance(e, ReasoningDelta) for e in events)
                ):
                    self._emit(ReasoningDelta(""), events)
                state = self._marker(state, marker, events)
        if (
            not text
            and not events
            and state.phase == CONTENT
            and self.tools is not None
            and self.tools.empty_content_deltas
        ):
            events.append(ContentDelta(""))
        if not events and self.reasoning is not None and self.reasoning.empty_deltas:
            lone_marker = len(token_ids) == 1 and token_ids[0] in self.markers
            if not lone_marker:
                if state.phase == REASONING:
                    self._emit(ReasoningDelta(""), events)
                elif (
                    state.phase == CONTENT
                    and self.reasoning.answer_empty_deltas
                    and not self._drops_text(state)
                ):
                    events.append(ContentDelta(""))
        if (
            self.tools_active
            and self.tools is not None
            and state.phase != REASONING
            and not any(isinstance(e, ContentDelta) for e in events)
            and self.tools.chunk_content(began_in, token_ids)
        ):
            events.append(ContentDelta(""))
        return state, events

    def finish(self, state: ChatState) -> tuple[ChatState, list[Event]]:
        """End of output: close an open tool call and report reasoning that never closed."""
        if self.chat is not None:
            return self._chat_step(state, self.chat.finish(self._chat_state(self.chat, state)))
        events: list[Event] = []
        if state.call is not None and self.tools is not None:
            state = self._close_call(state, events)
        if state.phase == REASONING:
            self._report_empty_reasoning(state, events)
            state = msgspec.structs.replace(state, reasoning_emitted=True)
        if state.held_space and not state.tools_started:
            events.append(ContentDelta(state.held_space))
            state = msgspec.structs.replace(state, held_space="")
        return state, events

    def _chat_state(self, chat: ChatFamily, state: ChatState) -> FamilyState:
        return state.call if state.call is not None else chat.start(())

    def _chat_step(
        self, state: ChatState, result: tuple[FamilyState, list[Event]]
    ) -> tuple[ChatState, list[Event]]:
        call, events = result
        started = state.tools_started + _starts(events)
        return msgspec.structs.replace(state, call=call, tools_started=started), events

    def _legacy_end(self, marker: int) -> bool:
        """An end-of-reasoning token under vLLM's legacy streaming (see `empty_deltas`)."""
        reasoning = self.reasoning
        return (
            reasoning is not None
            and reasoning.empty_deltas
            and reasoning.answer_empty_deltas
            and marker == reasoning.end_id
        )

    def _emit(self, event: Event, events: list[Event]) -> None:
        if self.request.include_reasoning or not isinstance(event, ReasoningDelta):
            events.append(event)

    def _drops_text(self, state: ChatState) -> bool:
        """Plain answer text is dropped: calls were opened and the family drops what follows."""
        return (
            self.tools_active
            and state.tool_seen
            and self.tools is not None
            and self.tools.drops_text_after_calls
        )

    def _text(self, state: ChatState, text: str, events: list[Event]) -> ChatState:
        if not text:
            return state
        if state.phase == REASONING:
            if self.reasoning is not None:
                self._emit(self.reasoning.text_event(text, not state.reasoning_emitted), events)
            lead = state.lead_space
            if state.reasoning_emitted and lead < 0:
                return state
            if lead >= 0:
                lead = lead + len(text) if text.isspace() else -1
            return msgspec.structs.replace(state, reasoning_emitted=True, lead_space=lead)
        if state.phase == IN_TOOL_CALL:
            if state.call is None or self.tools is None:
                return state  # markup swallowed while tools are off
            call, call_events = self.tools.feed(state.call, text)
            if len(call_events) == 1 and type(call_events[0]) is ToolArgsDelta:
                events.append(call_events[0])  # the per-token case inside arguments, kept lean
                return state if call is state.call else msgspec.structs.replace(state, call=call)
            return self._called(state, call, call_events, events)
        if self._drops_text(state):
            return state
        events.append(ContentDelta(text))
        return state

    def _called(
        self,
        state: ChatState,
        call: FamilyState | None,
        call_events: list[Event],
        events: list[Event],
    ) -> ChatState:
        if self.tools is None or not self.tools.engine:
            events.extend(call_events)
            started = state.tools_started + _starts(call_events)
            return msgspec.structs.replace(state, call=call, tools_started=started)
        return self._engine_events(msgspec.structs.replace(state, call=call), call_events, events)

    def _engine_events(
        self, state: ChatState, call_events: list[Event], events: list[Event]
    ) -> ChatState:
        """vLLM's engine: whitespace-only content before any text waits for text, and is
        dropped once a call starts (kept in the state, bounded)."""
        started, text_seen, held = state.tools_started, state.answer_text, state.held_space
        for event in call_events:
            if isinstance(event, ContentDelta):
                if text_seen or event.text.strip():
                    events.append(ContentDelta(held + event.text) if held else event)
                    text_seen, held = True, ""
                    continue
                held += event.text
                if len(held) > _MAX_HELD_SPACE:
                    events.append(ContentDelta(held))
                    text_seen, held = True, ""
                continue
            if isinstance(event, ToolCallStart):
                started, held = started + 1, ""
            events.append(event)
        if (started, text_seen, held) == (state.tools_started, state.answer_text, state.held_space):
            return state
        return msgspec.structs.replace(
            state, tools_started=started, answer_text=text_seen, held_space=held
        )

    def _marker(self, state: ChatState, token_id: int, events: list[Event]) -> ChatState:
        kind, spelling = self.markers[token_id]
        reasoning = self.reasoning
        if state.phase == REASONING and reasoning is not None:
            if kind == _THINK_START:
                if reasoning.batch_drops_space_before_start and state.lead_space > 0:
                    return msgspec.structs.replace(state, reasoning_lead=state.lead_space)
                return state
            if kind == _THINK_END:
                state = self._end_reasoning(state, events)
                end = reasoning.end_event()
                if end is not None:
                    self._emit(end, events)
                return state
            if kind == _TOOL_START and reasoning.tool_start_ends_reasoning:
                state = self._end_reasoning(state, events)
                return self._marker(state, token_id, events)
            return self._text(state, spelling, events)
        if state.phase == IN_TOOL_CALL:
            if kind == _TOOL_END:
                return self._answer(self._close_call(state, events))
            if kind == _TOOL_START and not self._start_is_text(state):
                state = self._close_call(state, events)
                return self._open_call(state)
            if kind == _TOOL_INNER and self.tools is not None:
                if state.call is None:
                    return state
                call, call_events = self.tools.marker(state.call, token_id, spelling)
                return self._called(state, call, call_events, events)
            return self._text(state, spelling, events)
        if (
            kind == _THINK_END
            and reasoning is not None
            and reasoning.drop_end_in_content
            and state.reasoning_emitted
        ):
            return state  # a repeated end of the reasoning this output had
        if (
            kind == _TOOL_START
            and self.tools is not None
            and (self.tools_active or self.tools.swallows_inactive_markup)
        ):
            return self._open_call(state)
        return self._text(state, spelling, events)

    def _end_reasoning(self, state: ChatState, events: list[Event]) -> ChatState:
        self._report_empty_reasoning(state, events)
        return self._answer(msgspec.structs.replace(state, phase=CONTENT, reasoning_emitted=True))

    def _report_empty_reasoning(self, state: ChatState, events: list[Event]) -> None:
        if self.reasoning is None or state.reasoning_emitted:
            return
        event = self.reasoning.empty_event()
        if event is not None:
            self._emit(event, events)

    def _answer(self, state: ChatState) -> ChatState:
        """The answer begins: a family whose calls need no start token reads it from here."""
        if not self.tools_active or self.tools is None:
            return state
        call = self.tools.begin_answer(state.tools_started)
        if call is None:
            return state
        return msgspec.structs.replace(state, phase=IN_TOOL_CALL, call=call)

    def _open_call(self, state: ChatState) -> ChatState:
        if self.tools is None:
            return state
        if not self.tools_active:
            return msgspec.structs.replace(state, phase=IN_TOOL_CALL, call=None)
        call = self.tools.begin(state.tools_started)
        return msgspec.structs.replace(state, phase=IN_TOOL_CALL, call=call, tool_seen=True)

    def _start_is_text(self, state: ChatState) -> bool:
        """A call-start token inside an open state that the family reads as text."""
        return (
            self.tools is not None
            and state.call is not None
            and self.tools.start_is_text(state.call)
        )

    def _close_call(self, state: ChatState, events: list[Event]) -> ChatState:
        if state.call is not None and self.tools is not None:
            state = self._called(state, None, self.tools.close(state.call), events)
        return msgspec.structs.replace(state, phase=CONTENT, call=None)


def build_chat_parser(
    reasoning: str | None,
    tool: str | None,
    facts: TokenizerFacts,
    request: ParseRequest,
    *,
    tool_strict_level: str | None = None,
) -> ChatParser | None:
    """The parser for one request, or None when no parser applies (plain detokenization).

    As in vLLM, a tool parser counts only with `request.enable_auto_tools`
    (`--enable-auto-tool-choice`). Unknown names raise `UnknownParserError` either way.
    """
    reasoning_family = None
    if reasoning is not None:
        reasoning_family = registry.build_family(reasoning, "reasoning", facts)
    tool_family = None
    if tool is not None:
        tool_family = registry.build_family(tool, "tool", facts)
    if not request.enable_auto_tools:
        tool_family = None
    if reasoning_family is None and tool_family is None:
        return None
    return ChatParser.build(reasoning_family, tool_family, request, tool_strict_level)


def _starts(events: list[Event]) -> int:
    return sum(1 for ev in events if isinstance(ev, ToolCallStart))
