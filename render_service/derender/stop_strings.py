"""Stop strings in batch derender: where vLLM's check_stop_strings cuts the text and the ids.

Streaming derender refuses stop strings (text already sent cannot be cut).
"""

from __future__ import annotations

from typing import NamedTuple

from render_service.errors import InvalidRequest
from render_service.protocol.sampling import SamplingRequest
from render_service.validation import stop_strings

STREAM_STOP_STRINGS = (
    "stop strings are not supported by streaming derender because text already sent cannot be cut. "
    "Use non-streaming derender or output_mode=text on /inference/v1/generate which holds stop "
    "strings back."
)


class StopStrings(NamedTuple):
    """A batch request's stop strings and ``min_tokens`` (no stop string ends the text before)."""

    strings: list[str]
    min_tokens: int = 0

    @classmethod
    def of(cls, request: SamplingRequest | None) -> StopStrings:
        """A request's stop strings (none without a request)."""
        if request is None:
            return cls([])
        return cls(stop_strings(request.stop), request.min_tokens)


def refuse_in_stream(stop: str | list[str] | None) -> None:
    """Streaming derender cannot honour stop strings: refuse a request that has some."""
    if stop_strings(stop):
        raise InvalidRequest(STREAM_STOP_STRINGS)


def stop_string_cut(
    text: str,
    pieces: list[str],
    stops: list[str],
    stop_reason: int | str | None,
    min_tokens: int,
    include: bool,
) -> tuple[int, str] | None:
    """Where batch derender cuts the text for a stop string (vLLM's check_stop_strings)."""
    candidates = [stop_reason] if isinstance(stop_reason, str) else stops
    if not candidates:
        return None
    floor = len("".join(pieces[:min_tokens])) if min_tokens else 0
    best: tuple[int, str] | None = None
    for stop in candidates:
        if not stop:
            continue
        position = text.find(stop, max(0, floor - len(stop) + 1))
        if position >= 0 and (best is None or position < best[0]):
            best = (position, stop)
    if best is None:
        return None
    position, stop = best
    return (position + len(stop) if include else position), stop


def ids_for_text(ids: list[int], pieces: list[str], text_end: int) -> list[int]:
    """The ids whose text starts before ``text_end`` (the parser sees the ids of the cut text)."""
    consumed = 0
    for count, piece in enumerate(pieces):
        if consumed >= text_end:
            return ids[:count]
        consumed += len(piece)
    return ids
