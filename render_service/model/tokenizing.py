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

Under the same check, a long stretch is cached as chunks of about ``_CHUNK_CHARS``, cut at such
places, each found from the text before it alone: a later stretch that begins the same way (the
same document with another question, a message that grew) finds its first chunks cached and
encodes only the rest.
"""

from __future__ import annotations

import bisect
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

# A cached stretch's cost beyond its str and id list: dict slot, LRU links, tuple.
_ENTRY_OVERHEAD = 160
# Stretches longer than this are encoded as parts in parallel (about 2,000 tokens a part).
_PART_CHARS = 8192
# A stretch at least twice this long is cached as chunks of about this many characters.
_CHUNK_CHARS = 512
# Where a long stretch may be cut: after a letter or digit, before a space and a letter.
_CUT = re.compile(r"(?<=[^\W_]) (?=[^\W\d_])")
_SAMPLE = (
    "Tokenizers split text into pre-tokens 12,345 times; l'été était très chaud. "
    "Ça va? Да, конечно! 你好 世界 テスト 한국어 émoji 🌍 x y z don't won't it's "
    "e\u0301 café\tTabs\n\nNew lines  two spaces   three, 3 digits 1234567 ok. "
)


def stretch_bytes(text: str, ids: list[int]) -> int:
    """A cached stretch's memory: the str and the id list as Python sizes them (its ints are
    the encoder's shared ones, counted once there), plus the entry's overhead (dict slot, LRU
    links, tuple)."""
    return _ENTRY_OVERHEAD + sys.getsizeof(text) + sys.getsizeof(ids)


class SegmentEncoder:
    """Encodes rendered prompts through an LRU of text stretches bounded by count and bytes
    (thread-safe).

    Cached ids are lists of one shared int object per vocabulary id (``_ints``): a prompt is
    then assembled by copying pointers. Kept as 4-byte arrays, every id of every prompt became a
    new int object again, ~20 ns each (~0.1 ms of a 4,500-token prompt's ~0.2 ms).
    """

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
        self._cache: OrderedDict[str, tuple[int, list[int]]] = OrderedDict()
        added = backend.get_added_tokens_decoder()
        self._ids = {token.content: token_id for token_id, token in added.items()}
        self.enabled = (
            max_entries > 0 and bool(self._ids) and all(_splits_cleanly(t) for t in added.values())
        )
        # One int object per id, shared by every cached list (8 bytes an id there, not 36).
        self._ints = (
            list(range(max(backend.get_vocab_size(with_added_tokens=True), *added) + 1))
            if self.enabled
            else []
        )
        self.parallel = self.enabled and _cuts_are_safe(backend)
        self._fast = fast_bpe.build(backend.to_str(), backend) if fast and self.enabled else None
        # Chunks need the byte length of every token: the tiktoken path's byte-level vocabulary.
        self._sizes = _token_sizes(backend) if self.parallel and self._fast is not None else None
        # (That path's tokenizers normalize with NFC or not at all.)
        self._nfc = backend.normalizer is not None
        contents = sorted(self._ids, key=len, reverse=True)
        self._split = (
            re.compile("(" + "|".join(re.escape(c) for c in contents) + ")") if contents else None
        )

    def encode(self, text: str) -> list[int]:
        """The ids of ``text`` without special tokens added (same as ``backend.encode``)."""
        if not self.enabled or self._split is None:
            return list(self.backend.encode(text, add_special_tokens=False).ids)
        pieces = self._split.split(text)
        out: list[int] = []
        # Stretches not cached whole, each with where its ids go in ``out``.
        pending: list[tuple[int, str]] = []
        cache = self._cache
        added = self._ids
        with self._lock:
            for index, piece in enumerate(pieces):
                # Short stretches too ("user\n", "\n"): an encoder call costs ~1.5-3 µs, a
                # lookup ~0.2 µs.
                if index % 2:
                    out.append(added[piece])
                elif piece:
                    entry = cache.get(piece)
                    if entry is None:
                        pending.append((len(out), piece))
                    else:
                        cache.move_to_end(piece)
                        out.extend(entry[1])
        if pending:
            resolved = self._resolve(list(dict.fromkeys(piece for _, piece in pending)))
            for at, piece in reversed(pending):
                out[at:at] = resolved[piece]
        return out

    def _resolve(self, pieces: list[str]) -> dict[str, Sequence[int]]:
        """The ids of stretches not cached whole: a long one from the cached chunks it begins
        with where it can, everything else encoded in one batch; then remembered."""
        found: dict[str, Sequence[int]] = {}
        missing: list[str] = []
        chunked: dict[str, list[str]] = {}
        with self._lock:
            for piece in pieces:
                if self._sizes is None or len(piece) < 2 * _CHUNK_CHARS:
                    missing.append(piece)
                    continue
                chunks = chunked[piece] = _cut(piece, _CHUNK_CHARS)
                for chunk in chunks:
                    if chunk not in found:
                        self._lookup(chunk, found)
        # A chunked stretch's chunks not cached are encoded as runs of consecutive chunks.
        layouts = {piece: _layout(chunks, found) for piece, chunks in chunked.items()}
        runs = {run: chunks for _, piece_runs in layouts.values() for run, chunks in piece_runs}
        batch = list(dict.fromkeys(missing + list(runs)))
        fresh: dict[str, Sequence[int]] = {}
        if batch:
            encoded = self._encode_many(batch)
            found.update(encoded)
            fresh.update((piece, encoded[piece]) for piece in missing)
            for run, chunks in runs.items():
                fresh.update(zip(chunks, self._split_ids(encoded[run], chunks) or (), strict=False))
        resolved: dict[str, Sequence[int]] = {piece: found[piece] for piece in missing}
        for piece, (segments, piece_runs) in layouts.items():
            ids: list[int] = []
            for segment in segments:
                ids.extend(found[segment])
            resolved[piece] = ids
            if not piece_runs:
                # Every chunk was cached: a stretch seen again in full (a system prompt with
                # its tools) is kept whole too, one lookup the next time.
                fresh[piece] = ids
        if fresh:
            self._remember(fresh)
        return resolved

    def _split_ids(self, ids: list[int], chunks: list[str]) -> list[list[int]] | None:
        """The ids of joined ``chunks`` cut at the chunks' ends, found from the tokens' byte
        lengths; None where a token would cross an end (then no chunk is cached)."""
        assert self._sizes is not None
        ends = list(itertools.accumulate(map(self._sizes.__getitem__, ids)))
        parts = []
        start = total = 0
        for chunk in chunks:
            if chunk.isascii():
                total += len(chunk)
            else:
                total += len((unicodedata.normalize("NFC", chunk) if self._nfc else chunk).encode())
            end = bisect.bisect_left(ends, total, start)
            if end >= len(ends) or ends[end] != total:
                return None
            parts.append(ids[start : end + 1])
            start = end + 1
        return parts if start == len(ids) else None

    def _lookup(self, piece: str, found: dict[str, Sequence[int]]) -> bool:
        """Whether ``piece`` is cached (its ids then go into ``found``); the lock is held."""
        entry = self._cache.get(piece)
        if entry is None:
            return False
        self._cache.move_to_end(piece)
        found[piece] = entry[1]
        return True

    def _encode_many(self, stretches: list[str]) -> dict[str, list[int]]:
        """Encode stretches in one parallel batch, long ones as several parts."""
        parts: list[str] = []
        owners: list[int] = []
        for index, stretch in enumerate(stretches):
            pieces = (
                _cut(stretch, _PART_CHARS)
                if self.parallel and len(stretch) > _PART_CHARS
                else [stretch]
            )
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
        shared = self._ints.__getitem__
        for piece, ids in fresh.items():
            try:
                compact = list(map(shared, ids))
            except IndexError:  # an id past the vocabulary's size: kept as its own ints
                compact = list(ids)
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


def _cut(text: str, size: int) -> list[str]:
    """``text`` in parts of about ``size`` characters, cut only where ``_CUT`` allows. Each cut
    depends only on the text before it (and the two characters after), so two stretches with
    the same beginning are cut alike there."""
    parts = []
    start = 0
    while len(text) - start > size:
        cut = _CUT.search(text, start + size)
        if cut is None:
            break
        parts.append(text[start : cut.start()])
        start = cut.start()
    parts.append(text[start:])
    return parts


def _layout(
    chunks: list[str], found: dict[str, Sequence[int]]
) -> tuple[list[str], list[tuple[str, list[str]]]]:
    """A chunked stretch as cached chunks and runs of consecutive uncached ones (joined), in
    order, and each run with its chunks."""
    segments: list[str] = []
    runs: list[tuple[str, list[str]]] = []
    run: list[str] = []
    for chunk in [*chunks, ""]:
        if chunk and chunk not in found:
            run.append(chunk)
            continue
        if run:
            joined = "".join(run)
            segments.append(joined)
            runs.append((joined, run))
            run = []
        if chunk:
            segments.append(chunk)
    return segments, runs


def _token_sizes(backend: tokenizers.Tokenizer) -> array[int]:
    """Each vocabulary token's length in bytes (a byte-level vocabulary spells a byte a
    character)."""
    vocab = backend.get_vocab(with_added_tokens=False)
    sizes = array("I", bytes(4 * (max(vocab.values(), default=0) + 1)))
    for token, token_id in vocab.items():
        sizes[token_id] = len(token)
    return sizes


def _cuts_are_safe(backend: tokenizers.Tokenizer) -> bool:
    """Whether cutting at every allowed place of a varied sample leaves its ids unchanged."""
    whole = backend.encode(_SAMPLE, add_special_tokens=False).ids
    cuts = [0, *(m.start() for m in _CUT.finditer(_SAMPLE)), len(_SAMPLE)]
    parts = [_SAMPLE[a:b] for a, b in itertools.pairwise(cuts) if b > a]
    encoded = backend.encode_batch(parts, add_special_tokens=False)
    return [i for enc in encoded for i in enc.ids] == whole
