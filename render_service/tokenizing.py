"""Prompt tokenization with a cache of text segments between added tokens.

A Hugging Face tokenizer first splits its input at added tokens (``<|im_start|>``, ...) and then
normalizes and pre-tokenizes each stretch of text between them on its own. So the ids of a
rendered chat are the concatenation of the ids of those stretches, and a stretch seen before (a
system prompt, earlier turns of a conversation, tool definitions) needs no new encoding. Misses
are encoded together with ``encode_batch``, which runs on all cores.

This only holds when no added token strips neighbouring whitespace or matches only whole words;
for such tokenizers, and whenever offsets or post-processing (BOS) are asked for, the whole text
is encoded in one call.
"""

from __future__ import annotations

import re
import threading
import unicodedata
from collections import OrderedDict

import tokenizers

# Stretches shorter than this are cheaper to encode again than to look up.
_MIN_CACHED_CHARS = 64


class SegmentEncoder:
    """Encodes rendered prompts through a bounded LRU of text stretches (thread-safe)."""

    def __init__(self, backend: tokenizers.Tokenizer, max_entries: int = 4096) -> None:
        self.backend = backend
        self.max_entries = max_entries
        self._lock = threading.Lock()
        self._cache: OrderedDict[str, list[int]] = OrderedDict()
        added = backend.get_added_tokens_decoder()
        self._ids = {token.content: token_id for token_id, token in added.items()}
        self.enabled = (
            max_entries > 0 and bool(self._ids) and all(_splits_cleanly(t) for t in added.values())
        )
        contents = sorted(self._ids, key=len, reverse=True)
        self._split = (
            re.compile("(" + "|".join(re.escape(c) for c in contents) + ")") if contents else None
        )

    def encode(self, text: str) -> list[int]:
        """The ids of ``text`` without special tokens added (same as ``backend.encode``)."""
        if not self.enabled or self._split is None:
            return list(self.backend.encode(text, add_special_tokens=False).ids)
        pieces = self._split.split(text)
        found: dict[str, list[int]] = {}
        missing: list[str] = []
        with self._lock:
            for index, piece in enumerate(pieces):
                if index % 2 == 1 or len(piece) < _MIN_CACHED_CHARS:
                    continue
                ids = self._cache.get(piece)
                if ids is None:
                    missing.append(piece)
                else:
                    self._cache.move_to_end(piece)
                    found[piece] = ids
        short = [p for i, p in enumerate(pieces) if i % 2 == 0 and p and len(p) < _MIN_CACHED_CHARS]
        batch = list(dict.fromkeys(missing + short))
        if batch:
            encoded = self.backend.encode_batch(batch, add_special_tokens=False)
            found.update({piece: list(enc.ids) for piece, enc in zip(batch, encoded, strict=True)})
            self._remember({piece: found[piece] for piece in missing})
        out: list[int] = []
        for index, piece in enumerate(pieces):
            if index % 2 == 1:
                out.append(self._ids[piece])
            elif piece:
                out.extend(found[piece])
        return out

    def _remember(self, fresh: dict[str, list[int]]) -> None:
        with self._lock:
            for piece, ids in fresh.items():
                self._cache[piece] = ids
            while len(self._cache) > self.max_entries:
                self._cache.popitem(last=False)

    def __len__(self) -> int:
        return len(self._cache)


def _splits_cleanly(token: tokenizers.AddedToken) -> bool:
    """Whether splitting at this token and encoding both sides apart gives the same ids."""
    content = token.content
    return (
        not token.lstrip
        and not token.rstrip
        and not token.single_word
        and bool(content)
        and unicodedata.normalize("NFC", content) == content
    )
