"""Split a chunk (ids + their text) at marker tokens, which are matched by id."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

__all__ = ["split_at_markers"]


def split_at_markers(
    token_ids: Sequence[int], text: str, markers: Mapping[int, str]
) -> list[tuple[int | None, str]]:
    """Return `(marker_id, marker_text)` and `(None, plain_text)` pieces in order.

    Only ids decide what is a marker. The marker's spelling is located in `text` left to
    right, so a chunk that holds both a real marker and the same spelling typed as plain
    tokens *before* it is ambiguous: callers that can produce such chunks split them at
    marker ids first (see `ChatParser.marker_ids`).
    """
    found = [tid for tid in token_ids if tid in markers]
    if not found:
        return [(None, text)] if text else []
    pieces: list[tuple[int | None, str]] = []
    pos = 0
    for tid in found:
        spelling = markers[tid]
        at = text.find(spelling, pos)
        if at < 0:
            # The detokenizer produced no text for it (e.g. skipped): still a marker.
            pieces.append((tid, ""))
            continue
        if at > pos:
            pieces.append((None, text[pos:at]))
        pieces.append((tid, spelling))
        pos = at + len(spelling)
    if pos < len(text):
        pieces.append((None, text[pos:]))
    return pieces
