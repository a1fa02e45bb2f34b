"""The per-choice derender machine's values: the options a request sets, the state a stream
carries between calls, and what one chunk produced."""

from __future__ import annotations

from dataclasses import dataclass

import msgspec

from parsers import ChatState, DetokState, Event, ParseRequest


class OutputOptions(msgspec.Struct, frozen=True, array_like=True, gc=False):
    """What a chat or completion request changes in derendering, kept in the stream state."""

    skip_special_tokens: bool = True
    include_stop_str_in_output: bool = False
    stop_token_ids: tuple[int, ...] = ()
    #: Logprob candidates kept per position (None: all that generate sent).
    logprob_limit: int | None = None
    return_token_ids: bool = False
    include_reasoning: bool = True
    parallel_tool_calls: bool = True
    forced_tools: bool = False
    named_tool: bool = False


class ChoiceState(msgspec.Struct, frozen=True, array_like=True, gc=False):
    """One choice's stream between calls: parser and detokenizer state, never the history.

    New fields go last with defaults (the codec's version covers incompatible changes).
    """

    request_id: str
    index: int
    prompt_len: int
    options: OutputOptions
    parse_request: ParseRequest | None
    parser: ChatState | None
    detok: DetokState
    digest: bytes
    n_tokens: int = 0
    role_sent: bool = False
    logprob_context: tuple[int, ...] = ()
    text_offset: int = 0


CachedState = tuple[str, ChoiceState]  # (the signed token we issued, its decoded state)


@dataclass(frozen=True)
class ChunkResult:
    """What one chunk of one choice produced."""

    text: str
    events: list[Event]
    kept_ids: list[int]
    state: ChoiceState
    stop_reason: int | str | None
