"""Typed parser events: what a chunk of model output turned out to be."""

from __future__ import annotations

from typing import TypeAlias

import msgspec

__all__ = [
    "ContentDelta",
    "Event",
    "ReasoningDelta",
    "ToolArgsDelta",
    "ToolCallEnd",
    "ToolCallStart",
]


class ReasoningDelta(msgspec.Struct, frozen=True, tag="reasoning", gc=False):
    """Reasoning text, in order."""

    text: str


class ContentDelta(msgspec.Struct, frozen=True, tag="content", gc=False):
    """Answer text, in order."""

    text: str


class ToolCallStart(msgspec.Struct, frozen=True, tag="tool_start", gc=False):
    """A tool call with a known function name begins; `index` counts calls from 0."""

    index: int
    name: str


class ToolArgsDelta(msgspec.Struct, frozen=True, tag="tool_args", gc=False):
    """More argument text of call `index`, exactly as the model wrote it."""

    index: int
    text: str


class ToolCallEnd(msgspec.Struct, frozen=True, tag="tool_end", gc=False):
    """Call `index` is over: closed, or the output ended inside it (`complete` false: its
    markup never closed, e.g. a JSON object cut by max_tokens)."""

    index: int
    complete: bool = True


Event: TypeAlias = ReasoningDelta | ContentDelta | ToolCallStart | ToolArgsDelta | ToolCallEnd
