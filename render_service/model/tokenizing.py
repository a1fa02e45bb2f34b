"""Prompt tokenization with a cache of text segments between added tokens.

A Hugging Face tokenizer first splits its input at added tokens (``<|im_start|>``, ...) and then
normalizes and pre-tokenizes each stretch of text between them on its own. So the ids of a
rendered chat are the concatenation of the ids of those stretches, and a stretch seen before (a
system prompt, earlier turns of a conversation, tool definitions) needs no new encoding. Misses
are encoded together with ``encode_batch``, which runs on all cores.

This only holds when no added token strips neighbouring whitespace or matches only whole words;
for such tokenizers, and whenever offsets or post-processing (BOS) are asked for, the whole text
is encoded in one call.

A long stretch is also cut into parts that encode in parallel. A cut goes between a letter or
digit and a space that starts a word (``...word| word...``): the pre-tokenizers of the byte-level
BPE families (Qwen, Llama 3, GPT-4o style) always end a pre-token there, and NFC cannot compose
across a space, so the ids do not change. Each tokenizer is checked on a sample at startup and
parts are only used when the check passes. Stretches go through tiktoken's encoder where it
reproduces this tokenizer (render_service/model/fast_bpe.py), else through ``tokenizers``.
"""

from __future__ import annotations

import itertools
import re
import sys
import threading
import unicodedata
from array import array
from collections import OrderedDict
from collections.abc import Sequence

import tokenizers

from render_service.model import fast_bpe

# Stretches shorter than this are cheaper to encode again than to look up.
_MIN_CACHED_CHARS = 64
# A cached stretch's cost beyond its str and id array: dict slot, LRU links, tuple.
_ENTRY_OVERHEAD = 160
# Stretches longer than this are encoded as parts in parallel (about 2,000 tokens a part).
_PART_CHARS = 8192
# Where a long stretch may be cut: after a letter or digit, before a space and a letter.
_CUT = re.compile(r"(?<=[^\W_]) (?=[^\W\d_])")
_SAMPLE = (
    "Tokenizers split text into pre-tokens 12,345 times; l'été était très chaud. "
    "Ça va? Да, конечно! 你好 世界 テスト 한국어 émoji 🌍 x y z don't won't it's "
    "e\u0301 café\tTabs\n\nNew lines  two spaces   three, 3 digits 1234567 ok. "
)


def stretch_bytes(text: str, ids: array[int]) -> int:
    """A cached stretch's memory: the str and the id array as Python sizes them, plus the
    entry's overhead (dict slot, LRU links, tuple)."""
    return _ENTRY_OVERHEAD + sys.getsizeof(text) + sys.getsizeof(ids)


class SegmentEncoder:
    """Encodes rendered prompts through an LRU of text stretches bounded by count and bytes
    (thread-safe). Ids are kept as 4-byte arrays, not lists of Python ints."""

    def __init__(
        self,
        backend: tokenizers.Tokenizer,
        max_entries: int = 4096,
        *,
        max_bytes: int = 64 * 1024 * 1024,
        fast: bool = True,
    ) -> None:
        self.backend = backend
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self.bytes = 0
        self._lock = threading.Lock()
        self._cache: OrderedDict[str, tuple[int, array[int]]] = OrderedDict()
        added = backend.get_added_tokens_decoder()
        self._ids = {token.content: token_id for token_id, token in added.items()}
        self.enabled = (
            max_entries > 0 and bool(self._ids) and all(_splits_cleanly(t) for t in added.values())
        )
        self.parallel = self.enabled and _cuts_are_safe(backend)
        self._fast = fast_bpe.build(backend.to_str(), backend) if fast and self.enabled else None
        contents = sorted(self._ids, key=len, reverse=True)
        self._split = (
            re.compile("(" + "|".join(re.escape(c) for c in contents) + ")") if contents else None
        )

    def encode(self, text: str) -> list[int]:
        """The ids of ``text`` without special tokens added (same as ``backend.encode``)."""
        if not self.enabled or self._split is None:
            return list(self.backend.encode(text, add_special_tokens=False).ids)
        pieces = self._split.split(text)
        found: dict[str, Sequence[int]] = {}
        missing: list[str] = []
        with self._lock:
            for index, piece in enumerate(pieces):
                if index % 2 == 1 or len(piece) < _MIN_CACHED_CHARS:
                    continue
                entry = self._cache.get(piece)
                if entry is None:
                    missing.append(piece)
                else:
                    self._cache.move_to_end(piece)
                    found[piece] = entry[1]
        short = [p for i, p in enumerate(pieces) if i % 2 == 0 and p and len(p) < _MIN_CACHED_CHARS]
        batch = list(dict.fromkeys(missing + short))
        if batch:
            found.update(self._encode_many(batch))
            self._remember({piece: found[piece] for piece in missing})
        out: list[int] = []
        for index, piece in enumerate(pieces):
            if index % 2 == 1:
                out.append(self._ids[piece])
            elif piece:
                out.extend(found[piece])
        return out

    def _encode_many(self, stretches: list[str]) -> dict[str, list[int]]:
        """Encode stretches in one parallel batch, long ones as several parts."""
        parts: list[str] = []
        owners: list[int] = []
        for index, stretch in enumerate(stretches):
            pieces = _cut(stretch) if self.parallel and len(stretch) > _PART_CHARS else [stretch]
            parts.extend(pieces)
            owners.extend([index] * len(pieces))
        if self._fast is not None:
            encoded = self._fast(parts)
        else:
            encoded = [
                enc.ids for enc in self.backend.encode_batch(parts, add_special_tokens=False)
            ]
        ids: list[list[int]] = [[] for _ in stretches]
        for owner, part_ids in zip(owners, encoded, strict=True):
            ids[owner].extend(part_ids)
        return dict(zip(stretches, ids, strict=True))

    def _remember(self, fresh: dict[str, Sequence[int]]) -> None:
        entries = []
        for piece, ids in fresh.items():
            compact = array("I", ids)
            entries.append((piece, stretch_bytes(piece, compact), compact))
        with self._lock:
            for piece, size, compact in entries:
                if size > self.max_bytes:
                    continue
                old = self._cache.pop(piece, None)
                if old is not None:
                    self.bytes -= old[0]
                self._cache[piece] = (size, compact)
                self.bytes += size
            while len(self._cache) > self.max_entries or self.bytes > self.max_bytes:
                self.bytes -= self._cache.popitem(last=False)[1][0]

    def __len__(self) -> int:
        return len(self._cache)

    def close(self) -> None:
        """Stop the fast encoder's threads."""
        if self._fast is not None:
            self._fast.close()


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


def _cut(text: str) -> list[str]:
    """``text`` in parts of about ``_PART_CHARS``, cut only where ``_CUT`` allows."""
    parts = []
    start = 0
    while len(text) - start > _PART_CHARS:
        cut = _CUT.search(text, start + _PART_CHARS)
        if cut is None:
            break
        parts.append(text[start : cut.start()])
        start = cut.start()
    parts.append(text[start:])
    return parts


def _cuts_are_safe(backend: tokenizers.Tokenizer) -> bool:
    """Whether cutting at every allowed place of a varied sample leaves its ids unchanged."""
    whole = backend.encode(_SAMPLE, add_special_tokens=False).ids
    cuts = [0, *(m.start() for m in _CUT.finditer(_SAMPLE)), len(_SAMPLE)]
    parts = [_SAMPLE[a:b] for a, b in itertools.pairwise(cuts) if b > a]
    encoded = backend.encode_batch(parts, add_special_tokens=False)
    return [i for enc in encoded for i in enc.ids] == whole
