"""What a parser family provides: the contract between one family module and the chat machine.

A registry row (`parsers/registry.py`) names one of three kinds of family:

* `ReasoningFamily`: a `<think>`-style section before the answer. Marker ids plus switches; a
  family whose rules the switches do not cover overrides the hooks (`bind`, `reasoning_ended`,
  `text_event`, ...).
* `ToolFamily`: tool-call markup in the answer. Its markers, a streaming scanner over its own
  `FamilyState`, its structural tag and render adjustments, its call-id format, and the switches
  in which formats differ (text after calls, markup while tools are off, answer-mode calls).
* `ChatFamily`: output that is not markers inside text but a protocol of its own (Harmony). It
  parses the whole output itself, in place of a reasoning and a tool family.

Families hold configuration only. Everything a stream needs between chunks is a `FamilyState`:
a frozen, tagged, small Struct that msgspec serializes as json and msgpack.
"""

from __future__ import annotations

from array import array
from collections.abc import Sequence
from typing import ClassVar, Literal, TypeAlias

import msgspec

from parsers.events import Event, ReasoningDelta
from parsers.ids import tool_call_id
from parsers.request import ParseRequest
from parsers.structural_tag import RenderAdjustments

__all__ = [
    "ChatFamily",
    "Family",
    "FamilyState",
    "Marker",
    "ReasoningFamily",
    "ToolFamily",
    "prompt_closes_reasoning",
]


class FamilyState(msgspec.Struct, frozen=True, gc=False, array_like=True):
    """Base of a family's stream state.

    A subclass sets a `tag=` unique among families and is named in its registry row, which
    makes it part of `ChatState`'s serialized union. Keep it bounded: at most one partial marker,
    one partial token or one held value, never the output so far.
    """


class Marker(msgspec.Struct, frozen=True):
    """A tool family's marker token, matched by id (its spelling typed as text is content).

    `start` opens the family's state (a call, or a section holding several calls), `end` closes
    it, and `inner` markers are handed to `ToolFamily.marker` while the state is open (outside
    it they are ordinary text).
    """

    token_id: int
    text: str
    role: Literal["start", "end", "inner"]


class ReasoningFamily(msgspec.Struct, frozen=True):
    """Marker ids and the switches in which `<think>`-style families differ.

    A family that differs only in spellings and switches is a configuration of this class; one
    that needs other rules subclasses it and overrides the hooks below.
    """

    family: str
    start_id: int
    start_text: str
    end_id: int
    end_text: str
    #: `chat_template_kwargs.enable_thinking` false means the output starts as the answer.
    honours_enable_thinking: bool = False
    #: A tool-call start token inside reasoning ends the reasoning (the call is then parsed).
    tool_start_ends_reasoning: bool = False
    #: An end token after reasoning already ended is dropped instead of kept as content.
    drop_end_in_content: bool = False
    #: Reasoning that closes with no text still reports `""` (vLLM's R1 parser does).
    report_empty_reasoning: bool = False
    #: vLLM's legacy (text-accumulating) streaming: a chunk that adds no text to its phase still
    #: yields an empty delta for it, and a chunk that crosses the end token always reports the
    #: reasoning part before it, even when empty. Only a lone marker token yields nothing.
    empty_deltas: bool = False
    #: With `empty_deltas`, whether the answer side follows the legacy streaming too (the empty
    #: reasoning part of a crossing chunk, `content: ""` for an answer chunk without text).
    answer_empty_deltas: bool = True
    #: vLLM's batch answer drops what precedes the start marker; the batch rule drops it when it
    #: is only whitespace (DeepSeek-R1's `"\n<think>…"`, see `parsers.message`).
    batch_drops_space_before_start: bool = False
    #: The family's adjust_request sets skip_special_tokens=False (engine-based parsers do).
    keeps_special_tokens: bool = False
    #: Ids that end a turn; the prompt look-back stops there.
    boundary_ids: frozenset[int] = frozenset()
    #: Tool-call marker ids, for the "unclosed tool call in the prompt" check.
    tool_start_id: int | None = None
    tool_end_id: int | None = None
    #: Spelling of `tool_start_id`, which ends reasoning when `tool_start_ends_reasoning`.
    tool_start_text: str = "<tool_call>"

    def bind(self, request: ParseRequest) -> ReasoningFamily | None:
        """The family for one request; None when this request's output has no reasoning section
        (vLLM's identity parser, e.g. a template switch that turns thinking off)."""
        return self

    def thinking_enabled(self, chat_template_kwargs: dict[str, object]) -> bool:
        """Whether the output is expected to start inside reasoning."""
        if not self.honours_enable_thinking:
            return True
        return bool(chat_template_kwargs.get("enable_thinking", True))

    def reasoning_ended(self, request: ParseRequest, prompt_token_ids: Sequence[int]) -> bool:
        """vLLM's `is_reasoning_end(prompt)` for render's `reasoning_ended`.

        Asked of the configured family, also when `bind` turned it off for this request.
        """
        return prompt_closes_reasoning(self, prompt_token_ids)

    def text_event(self, text: str, first: bool) -> Event:
        """The event for reasoning text; `first` when nothing was emitted before it."""
        return ReasoningDelta(text)

    def empty_event(self) -> Event | None:
        """What reasoning that closes (or ends) without any text reports, if anything."""
        return ReasoningDelta("") if self.report_empty_reasoning else None

    def end_event(self) -> Event | None:
        """What the end marker itself turns into when it closes reasoning (default: nothing)."""
        return None

    def render_adjustments(self, request: ParseRequest) -> RenderAdjustments:
        """What this family's adjust_request changes in the rendered sampling params."""
        return RenderAdjustments(skip_special_tokens=False if self.keeps_special_tokens else None)


class ToolFamily(msgspec.Struct, frozen=True):
    """Base of tool-call families: configuration, plus a scanner over a `FamilyState`.

    The chat machine opens the state at a `start` marker (`begin`), hands it the text and
    `inner` markers up to the `end` marker (`feed`, `marker`) and closes it there or at the end
    of output (`close`). The state may emit content and several calls: the machine numbers calls
    by counting `ToolCallStart` events, and `begin` receives the next free index.
    """

    #: vLLM's adjust_request sets skip_special_tokens=False for this family (when tools apply).
    keeps_special_tokens: ClassVar[bool] = False
    #: Once a call started, plain text outside calls is dropped (hermes), not content.
    drops_text_after_calls: ClassVar[bool] = True
    #: With tools off for a request (no tools, tool_choice "none"), markup from a start marker to
    #: its end marker is dropped instead of being kept as content.
    swallows_inactive_markup: ClassVar[bool] = False
    #: vLLM's parser answers a chunk of the plain answer that adds no text (a held-back
    #: character, the stop token) with an empty content delta, whether tools apply or not.
    empty_content_deltas: ClassVar[bool] = False
    #: `--tool-strict-level` when the server sets none (vLLM's `default_tool_strict_level`).
    default_strict_level: ClassVar[str] = "auto"
    #: vLLM 0.33 runs the family on its parser engine (`vllm/parser/engine`): leading
    #: whitespace-only content waits for text and is dropped once a call starts, and the batch
    #: answer follows the engine rules of `parsers.message.batch_message`.
    engine: ClassVar[bool] = False
    #: vLLM's batch path parses the arguments as JSON (hermes, llama3_json): a call that is not
    #: valid JSON makes the batch answer the output as written. False where it takes them as
    #: text (deepseek_v31): calls are kept as written, and those whose markup never closed
    #: (`ToolCallEnd.complete`) are dropped.
    validates_arguments: ClassVar[bool] = True

    def markers(self) -> tuple[Marker, ...]:
        """This family's marker tokens for the tokenizer it was built for."""
        raise NotImplementedError

    def bind(self, request: ParseRequest, reasoning: ReasoningFamily | None) -> ToolFamily:
        """The family for one request: capture what it adds (e.g. parameter types).

        `reasoning` is the configured reasoning family, for formats whose rules change with it;
        a switch that changes can be set by returning an instance of a subclass.
        """
        return self

    def begin(self, index: int) -> FamilyState:
        """State after a `start` marker; the first call it emits gets `index`."""
        raise NotImplementedError

    def begin_answer(self, index: int) -> FamilyState | None:
        """State for an answer that may itself be calls (no start token), or None.

        Asked when the answer begins and after each `end` marker; the state then sees all
        answer text and emits `ContentDelta`s for what is not a call.
        """
        return None

    def feed(self, call: FamilyState, text: str) -> tuple[FamilyState, list[Event]]:
        """Scan more text inside the open state."""
        raise NotImplementedError

    def start_is_text(self, call: FamilyState) -> bool:
        """Whether a `start` marker inside the open state is text (default: it closes the state
        and opens the next)."""
        return False

    def marker(
        self, call: FamilyState, token_id: int, text: str
    ) -> tuple[FamilyState, list[Event]]:
        """An `inner` marker inside the open state; by default it is text."""
        return self.feed(call, text)

    def close(self, call: FamilyState) -> list[Event]:
        """The `end` marker or end of output: finish an open call (`ToolCallEnd`)."""
        raise NotImplementedError

    def structural_tag(self, request: ParseRequest, strict_level: str) -> str | None:
        """vLLM's `structured_outputs.structural_tag` for this request, byte for byte, or None."""
        return None

    def chunk_content(self, began_in: FamilyState | None, token_ids: Sequence[int]) -> bool:
        """Whether vLLM's streaming answers this answer chunk with content even when it has
        no text (`content: ""`), while tools are in play; `began_in` is the family's state
        when the chunk began (None outside any). Default: never."""
        return False

    def render_adjustments(self, request: ParseRequest, strict_level: str) -> RenderAdjustments:
        """What vLLM's adjust_request changes for this family (tools in play only)."""
        if request.effective_tool_choice == "none":
            return RenderAdjustments()
        return RenderAdjustments(
            skip_special_tokens=False if self.keeps_special_tokens else None,
            structural_tag=self.structural_tag(request, strict_level),
        )

    def reasoning_ended(self, request: ParseRequest) -> bool | None:
        """True when the family's own grammar covers reasoning (render's `reasoning_ended`
        is then True whatever the prompt); None defers to the reasoning family."""
        return None

    def call_id(self, request_id: str, choice_index: int, tool_index: int) -> str:
        """The id of call `tool_index`: deterministic, so a retried chunk gets the same one."""
        return tool_call_id(request_id, choice_index, tool_index)


class ChatFamily(msgspec.Struct, frozen=True):
    """A family that parses the whole output itself (Harmony's channels and recipients).

    Built by a reasoning row, a tool row or both; `bind` sees both configured families (one of
    them is this one) and the request, and may refuse a combination with `ParserConfigError`.
    The chat machine keeps this family's state in `ChatState.call` and counts its calls.
    """

    default_strict_level: ClassVar[str] = "auto"
    #: The batch switches of `ToolFamily` (`engine`, `validates_arguments`), for this family's calls.
    engine: ClassVar[bool] = False
    validates_arguments: ClassVar[bool] = True
    #: The family reads the tools' parameter schemas after `start` (a stream's state keeps them;
    #: otherwise it keeps tool names only).
    tool_schemas: ClassVar[bool] = False

    def bind(
        self, request: ParseRequest, reasoning: Family | None, tools: Family | None
    ) -> ChatFamily:
        """The family for one request; `tools` is None unless tool calls are parsed."""
        return self

    def marker_ids(self) -> frozenset[int]:
        """Ids a caller may split chunks at (see `ChatParser.marker_ids`)."""
        return frozenset()

    def start(self, prompt_token_ids: Sequence[int]) -> FamilyState:
        """Initial state for an output that follows this prompt."""
        raise NotImplementedError

    def feed(
        self, state: FamilyState, token_ids: Sequence[int], text: str
    ) -> tuple[FamilyState, list[Event]]:
        """Parse one chunk: `text` is the decode of exactly `token_ids`, special tokens kept."""
        raise NotImplementedError

    def finish(self, state: FamilyState) -> tuple[FamilyState, list[Event]]:
        """End of output: flush what was held back, end an open call."""
        raise NotImplementedError

    def reasoning_ended(self, prompt_token_ids: Sequence[int]) -> bool | None:
        """Render's `reasoning_ended` for this prompt (when the request includes reasoning)."""
        return None

    def render_adjustments(self, strict_level: str) -> RenderAdjustments:
        """What vLLM's adjust_request changes for the bound request."""
        return RenderAdjustments()

    def call_id(self, request_id: str, choice_index: int, tool_index: int) -> str:
        """The id of call `tool_index` (deterministic)."""
        return tool_call_id(request_id, choice_index, tool_index)


Family: TypeAlias = ReasoningFamily | ToolFamily | ChatFamily


def prompt_closes_reasoning(config: ReasoningFamily, prompt_token_ids: Sequence[int]) -> bool:
    """vLLM's `is_reasoning_end(prompt)`: did the prompt already leave reasoning?

    Scans back from the end: an end token means yes, a start token or a turn boundary
    means no. Families with tool markers also count an unclosed tool-call start found
    before any start token (a prompt that pre-fills a tool call).
    """
    start, end, boundaries = config.start_id, config.end_id, config.boundary_ids
    for token_id in reversed(prompt_token_ids):
        if token_id == end:
            return True
        if token_id == start or token_id in boundaries:
            break
    if config.tool_start_id is None:
        return False
    # An unclosed tool-call start after the last reasoning start: the last tool start comes
    # after both the last reasoning start and the last tool end. Searched in C, not per id.
    tool_start, reasoning_start, tool_end = _last_indices(
        prompt_token_ids, (config.tool_start_id, start, config.tool_end_id)
    )
    return tool_start > max(reasoning_start, tool_end)


def _last_indices(ids: Sequence[int], token_ids: tuple[int | None, ...]) -> list[int]:
    """Index of the last occurrence of each of ``token_ids`` in ``ids`` (-1: absent or None).

    The ids are packed as 32-bit words once and each id found by a byte search from the end
    (a match must start on a word boundary): a list's own search compares Python ints one by
    one, ~0.1 ms per id over a 4k-token prompt. Ids that do not fit 32 bits take that path.
    """
    try:
        data = array("I", ids).tobytes()
    except (OverflowError, TypeError):
        backwards = list(reversed(ids))
        return [_last_index(backwards, token_id) for token_id in token_ids]
    found = []
    for token_id in token_ids:
        at = -1
        if token_id is not None and 0 <= token_id <= _UINT32_MAX:
            needle = array("I", (token_id,)).tobytes()
            end = len(data)
            while (pos := data.rfind(needle, 0, end)) >= 0:
                if pos % _WORD == 0:
                    at = pos // _WORD
                    break
                end = pos + _WORD - 1  # only matches starting before this misaligned one
        found.append(at)
    return found


_WORD = array("I").itemsize
_UINT32_MAX = 2**32 - 1


def _last_index(backwards: list[int], token_id: int | None) -> int:
    """Index of the last ``token_id`` in the original order (-1: absent), from the reversed ids."""
    if token_id is None:
        return -1
    try:
        return len(backwards) - 1 - backwards.index(token_id)
    except ValueError:
        return -1
