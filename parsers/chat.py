"""`ChatParser`: reasoning phase, then answer and tool calls, as a value-in value-out machine."""

from __future__ import annotations

from collections.abc import Sequence

import msgspec

from parsers._segments import split_at_markers
from parsers.events import ContentDelta, Event, ReasoningDelta, ToolCallStart
from parsers.reasoning import ReasoningConfig, prompt_closes_reasoning
from parsers.request import ParseRequest
from parsers.structural_tag import RenderAdjustments, render_adjustments
from parsers.tools import ToolCallState, ToolConfig
from parsers.tools.llama3_json import LlamaConfig

__all__ = ["ChatParser", "ChatState"]

REASONING = 0
CONTENT = 1
IN_TOOL_CALL = 2

# Marker kinds.
_THINK_START = 0
_THINK_END = 1
_TOOL_START = 2
_TOOL_END = 3


class ChatState(msgspec.Struct, frozen=True, gc=False):
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
    #: The call being read, if the output is inside one.
    call: ToolCallState | None = None

    @property
    def tools_emitted(self) -> bool:
        """Whether any tool call was emitted (finish_reason "tool_calls")."""
        return self.tools_started > 0


class ChatParser(msgspec.Struct, frozen=True):
    """Configuration only: reasoning family, tool family, the request and marker ids.

    `start`, `feed` and `finish` take a `ChatState` and return a new one with the events;
    feeding a chunk costs O(chunk), whatever came before.
    """

    reasoning: ReasoningConfig | None
    tools: ToolConfig | None
    request: ParseRequest
    #: Marker token id -> (kind, spelling).
    markers: dict[int, tuple[int, str]]
    #: Marker token id -> spelling, for splitting chunks.
    spellings: dict[int, str]
    #: Whether tool markup is parsed into calls (a tool parser, tools, tool_choice not "none").
    tools_active: bool
    #: vLLM's `--tool-strict-level`: "auto", "function" or "parameter".
    tool_strict_level: str = "auto"

    @classmethod
    def build(
        cls,
        reasoning: ReasoningConfig | None,
        tools: ToolConfig | None,
        request: ParseRequest,
        tool_strict_level: str = "auto",
    ) -> ChatParser:
        """Combine a reasoning and a tool configuration for one request."""
        markers: dict[int, tuple[int, str]] = {}
        if tools is not None:
            tools = tools.bind(request)
            markers[tools.start_id] = (_TOOL_START, tools.start_text)
            if tools.end_id is not None:
                markers[tools.end_id] = (_TOOL_END, tools.end_text)
        if reasoning is not None:
            markers[reasoning.start_id] = (_THINK_START, reasoning.start_text)
            markers[reasoning.end_id] = (_THINK_END, reasoning.end_text)
            if reasoning.tool_start_ends_reasoning and reasoning.tool_start_id is not None:
                markers.setdefault(reasoning.tool_start_id, (_TOOL_START, "<tool_call>"))
        active = (
            tools is not None
            and request.enable_auto_tools
            and bool(request.tools)
            and request.effective_tool_choice != "none"
        )
        spellings = {tid: spelling for tid, (_, spelling) in markers.items()}
        return cls(reasoning, tools, request, markers, spellings, active, tool_strict_level)

    @property
    def marker_ids(self) -> frozenset[int]:
        """Ids this parser treats as markers; a caller may split chunks at them."""
        return frozenset(self.markers)

    def reasoning_ended(self, prompt_token_ids: Sequence[int]) -> bool | None:
        """What vLLM 0.33's render puts in `reasoning_ended` for this prompt."""
        if not self.request.include_reasoning:
            return True
        if self.reasoning is None:
            return None
        return prompt_closes_reasoning(self.reasoning, prompt_token_ids)

    def render_adjustments(self) -> RenderAdjustments:
        """How render must change the request's sampling params (vLLM's adjust_request)."""
        return render_adjustments(self.reasoning, self.tools, self.request, self.tool_strict_level)

    def structural_tag(self) -> str | None:
        """The exact `structured_outputs.structural_tag` vLLM 0.33 renders, or None."""
        return self.render_adjustments().structural_tag

    def start(self, prompt_token_ids: Sequence[int]) -> ChatState:
        """Initial state: inside reasoning unless the prompt or the template switches closed it."""
        reasoning = self.reasoning
        if (
            reasoning is None
            or not reasoning.thinking_enabled(self.request.chat_template_kwargs)
            or prompt_closes_reasoning(reasoning, prompt_token_ids)
        ):
            return self._answer(ChatState(phase=CONTENT))
        return ChatState(phase=REASONING)

    def feed(
        self, state: ChatState, token_ids: Sequence[int], text: str
    ) -> tuple[ChatState, list[Event]]:
        """Parse one chunk: `text` is the decode of exactly `token_ids`, special tokens kept."""
        events: list[Event] = []
        phase = state.phase
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
                state = self._marker(state, self.markers[marker], events)
        if not events and self.reasoning is not None and self.reasoning.empty_deltas:
            lone_marker = len(token_ids) == 1 and token_ids[0] in self.markers
            if not lone_marker:
                if state.phase == REASONING:
                    self._emit(ReasoningDelta(""), events)
                elif state.phase == CONTENT and not (self.tools_active and state.tool_seen):
                    events.append(ContentDelta(""))
        return state, events

    def _legacy_end(self, marker: int) -> bool:
        """An end-of-reasoning token under vLLM's legacy streaming (see `empty_deltas`)."""
        reasoning = self.reasoning
        return reasoning is not None and reasoning.empty_deltas and marker == reasoning.end_id

    def _emit(self, event: ReasoningDelta, events: list[Event]) -> None:
        if self.request.include_reasoning:
            events.append(event)

    def finish(self, state: ChatState) -> tuple[ChatState, list[Event]]:
        """End of output: close an open tool call and report reasoning that never closed."""
        events: list[Event] = []
        if state.call is not None and self.tools is not None:
            state = self._close_call(state, events)
        if state.phase == REASONING:
            self._report_empty_reasoning(state, events)
            state = msgspec.structs.replace(state, reasoning_emitted=True)
        return state, events

    def _text(self, state: ChatState, text: str, events: list[Event]) -> ChatState:
        if not text:
            return state
        if state.phase == REASONING:
            if self.request.include_reasoning:
                events.append(ReasoningDelta(text))
            if state.reasoning_emitted:
                return state
            return msgspec.structs.replace(state, reasoning_emitted=True)
        if state.phase == IN_TOOL_CALL and state.call is not None and self.tools is not None:
            call, call_events = self.tools.feed(state.call, text)
            events.extend(call_events)
            started = state.tools_started + _starts(call_events)
            return msgspec.structs.replace(state, call=call, tools_started=started)
        if self.tools_active and state.tool_seen:
            return state
        events.append(ContentDelta(text))
        return state

    def _marker(self, state: ChatState, marker: tuple[int, str], events: list[Event]) -> ChatState:
        kind, spelling = marker
        reasoning = self.reasoning
        if state.phase == REASONING and reasoning is not None:
            if kind == _THINK_START:
                return state
            if kind == _THINK_END:
                return self._end_reasoning(state, events)
            if kind == _TOOL_START and reasoning.tool_start_ends_reasoning:
                state = self._end_reasoning(state, events)
                return self._marker(state, marker, events)
            return self._text(state, spelling, events)
        if state.phase == IN_TOOL_CALL:
            if kind == _TOOL_END:
                return self._close_call(state, events)
            if kind == _TOOL_START:
                state = self._close_call(state, events)
                return self._open_call(state)
            return self._text(state, spelling, events)
        if kind == _THINK_END and reasoning is not None and reasoning.drop_end_in_content:
            return state
        if kind == _TOOL_START and self.tools_active and self.tools is not None:
            return self._open_call(state)
        return self._text(state, spelling, events)

    def _end_reasoning(self, state: ChatState, events: list[Event]) -> ChatState:
        self._report_empty_reasoning(state, events)
        return self._answer(msgspec.structs.replace(state, phase=CONTENT, reasoning_emitted=True))

    def _report_empty_reasoning(self, state: ChatState, events: list[Event]) -> None:
        reasoning = self.reasoning
        if (
            reasoning is not None
            and reasoning.report_empty_reasoning
            and not state.reasoning_emitted
            and self.request.include_reasoning
        ):
            events.append(ReasoningDelta(""))

    def _answer(self, state: ChatState) -> ChatState:
        """The answer begins: a family whose calls need no start token reads it from here."""
        if not (self.tools_active and isinstance(self.tools, LlamaConfig)):
            return state
        call = self.tools.begin_answer(state.tools_started)
        return msgspec.structs.replace(state, phase=IN_TOOL_CALL, call=call)

    def _open_call(self, state: ChatState) -> ChatState:
        if self.tools is None:
            return state
        call = self.tools.begin(state.tools_started)
        return msgspec.structs.replace(state, phase=IN_TOOL_CALL, call=call, tool_seen=True)

    def _close_call(self, state: ChatState, events: list[Event]) -> ChatState:
        started = state.tools_started
        if state.call is not None and self.tools is not None:
            call_events = self.tools.close(state.call)
            events.extend(call_events)
            started += _starts(call_events)
        return msgspec.structs.replace(state, phase=CONTENT, call=None, tools_started=started)


def _starts(events: list[Event]) -> int:
    return sum(1 for ev in events if isinstance(ev, ToolCallStart))
