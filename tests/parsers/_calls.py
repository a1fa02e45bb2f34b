"""What a client accumulates from parser events: each call's name and arguments, the content."""

from __future__ import annotations

from collections.abc import Sequence

from parsers.events import ContentDelta, Event, ToolArgsDelta, ToolCallStart


def outcome(events: Sequence[Event]) -> tuple[list[tuple[str, str]], str | None]:
    """(name, arguments) per call in index order, and the joined content (None if empty)."""
    calls: dict[int, list[str]] = {}
    content: list[str] = []
    for event in events:
        if isinstance(event, ToolCallStart):
            calls[event.index] = [event.name, ""]
        elif isinstance(event, ToolArgsDelta):
            calls[event.index][1] += event.text
        elif isinstance(event, ContentDelta):
            content.append(event.text)
    return [(name, args) for name, args in calls.values()], "".join(content) or None
