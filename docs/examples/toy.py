"""Toy tool calls: `<tool>NAME\\nARGUMENTS</tool>` (registry name `toy`).

The example family of docs/writing-a-parser.md, not a real model's format. `<tool>` and
`</tool>` are added tokens, matched by id. The function name runs to the first newline; the
rest, up to `</tool>`, is the arguments JSON, forwarded exactly as written. The state holds
only the name while it is being read.
"""

from __future__ import annotations

from typing import ClassVar

from parsers.events import Event, ToolArgsDelta, ToolCallEnd, ToolCallStart
from parsers.facts import TokenizerFacts
from parsers.family import FamilyState, Marker, ToolFamily
from parsers.request import ParseRequest
from parsers.structural_tag import TagSpelling, tool_tags_format

__all__ = ["ToyCall", "ToyTools", "build"]

_TAGS = (TagSpelling(begin="<tool>{name}\n", end="</tool>"),)


class ToyCall(FamilyState, frozen=True, tag="toy"):
    """Inside one `<tool>`: the name read so far, until the newline that ends it."""

    index: int
    name: str = ""
    started: bool = False


class ToyTools(ToolFamily, frozen=True):
    """The toy format's marker ids for one tokenizer."""

    start_id: int
    end_id: int

    #: Render sets skip_special_tokens=False, so that the markers reach the parser.
    keeps_special_tokens: ClassVar[bool] = True

    def markers(self) -> tuple[Marker, ...]:
        """`<tool>` opens a call, `</tool>` closes it."""
        return (Marker(self.start_id, "<tool>", "start"), Marker(self.end_id, "</tool>", "end"))

    def begin(self, index: int) -> ToyCall:
        """`<tool>` was seen: a call named by the next line."""
        return ToyCall(index=index)

    def feed(self, call: FamilyState, text: str) -> tuple[FamilyState, list[Event]]:
        """The name up to the newline, then the arguments as they come."""
        if not isinstance(call, ToyCall):
            return call, []
        if call.started:
            return call, [ToolArgsDelta(call.index, text)]
        name, newline, args = text.partition("\n")
        if not newline:
            return ToyCall(call.index, call.name + name), []
        events: list[Event] = [ToolCallStart(call.index, (call.name + name).strip())]
        if args:
            events.append(ToolArgsDelta(call.index, args))
        return ToyCall(call.index, started=True), events

    def close(self, call: FamilyState) -> list[Event]:
        """`</tool>` or the end of output: the call is complete."""
        if isinstance(call, ToyCall) and call.started:
            return [ToolCallEnd(call.index)]
        return []

    def structural_tag(self, request: ParseRequest, strict_level: str) -> str | None:
        """One `<tool>NAME\\n` ... `</tool>` tag per tool, triggered by `<tool>`."""
        return tool_tags_format(_TAGS, "<tool>", request, strict_level)


def build(facts: TokenizerFacts) -> ToyTools:
    """The toy family for this tokenizer (it must have both marker tokens)."""
    return ToyTools(
        start_id=facts.marker_id("<tool>", "toy"), end_id=facts.marker_id("</tool>", "toy")
    )
