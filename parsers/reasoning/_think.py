"""Configuration shared by every start/end-token reasoning family."""

from __future__ import annotations

from collections.abc import Sequence

import msgspec

__all__ = ["ReasoningConfig", "prompt_closes_reasoning"]


class ReasoningConfig(msgspec.Struct, frozen=True):
    """Marker ids and the few switches in which `<think>` families differ."""

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
    #: The family's adjust_request sets skip_special_tokens=False (engine-based parsers do).
    keeps_special_tokens: bool = False
    #: Ids that end a turn; the prompt look-back stops there.
    boundary_ids: frozenset[int] = frozenset()
    #: Tool-call marker ids, for the "unclosed tool call in the prompt" check.
    tool_start_id: int | None = None
    tool_end_id: int | None = None

    def thinking_enabled(self, chat_template_kwargs: dict[str, object]) -> bool:
        """Whether the output is expected to start inside reasoning."""
        if not self.honours_enable_thinking:
            return True
        return bool(chat_template_kwargs.get("enable_thinking", True))


def prompt_closes_reasoning(config: ReasoningConfig, prompt_token_ids: Sequence[int]) -> bool:
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
    tool_start = config.tool_start_id
    if tool_start is None:
        return False
    closed_later = False
    for token_id in reversed(prompt_token_ids):
        if token_id == start:
            return False
        if token_id == config.tool_end_id:
            closed_later = True
        elif token_id == tool_start and not closed_later:
            return True
    return False
