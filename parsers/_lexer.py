"""Cut text into plain pieces and literal tags, holding back a tail that may still become a tag.

Families whose markup is plain text (MiniMax's `<invoke name="…">`, GLM's `<arg_key>`) are
lexed the way vLLM 0.33's parser engine lexes them, so that the same text is held back between
chunks: at each position where a literal could start, the longest literal found there is a
tag; a tail that is a proper prefix of some literal waits for the next chunk (at most the
longest literal, so the hold is bounded); any other character is text. `final` lexes the tail
too (end of output, or a marker token that flushes the hold).
"""

from __future__ import annotations

import re
from collections.abc import Mapping

__all__ = ["Lexicon", "Piece"]

#: (kind, text): kind is the literal's kind, or None for plain text.
Piece = tuple[int | None, str]


class Lexicon:
    """The literals of one family and their kinds; built once, shared by every stream."""

    __slots__ = ("_by_first", "_first", "_prefixes", "max_len")

    def __init__(self, literals: Mapping[str, int]) -> None:
        by_first: dict[str, list[tuple[str, int]]] = {}
        for spelling, kind in literals.items():
            by_first.setdefault(spelling[0], []).append((spelling, kind))
        for options in by_first.values():
            options.sort(key=lambda item: -len(item[0]))  # longest match wins
        self._by_first = by_first
        self._first = re.compile("[" + "".join(re.escape(c) for c in sorted(by_first)) + "]")
        self._prefixes = frozenset(s[:i] for s in literals for i in range(1, len(s)))
        self.max_len = max((len(s) for s in literals), default=0)

    def may_hold(self, text: str) -> bool:
        """Whether `text` contains a character a literal starts with (the slow path applies)."""
        return self._first.search(text) is not None

    def lex(self, hold: str, text: str, final: bool = False) -> tuple[list[Piece], str]:
        """Pieces of `hold + text` in order, and the tail to hold back."""
        text = hold + text
        pieces: list[Piece] = []
        start = 0  # start of the pending plain text
        at = 0
        first = self._first
        while True:
            found = first.search(text, at)
            if found is None:
                break
            at = found.start()
            rest = text[at:]
            if not final and rest in self._prefixes:
                if at > start:
                    pieces.append((None, text[start:at]))
                return pieces, rest
            for spelling, kind in self._by_first[text[at]]:
                if rest.startswith(spelling):
                    if at > start:
                        pieces.append((None, text[start:at]))
                    pieces.append((kind, spelling))
                    at = start = at + len(spelling)
                    break
            else:
                at += 1
        if start < len(text):
            pieces.append((None, text[start:]))
        return pieces, ""
