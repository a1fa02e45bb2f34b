"""A per-process cache of live stream states, keyed by a running digest of the output so far.

The key after k output ids is ``running_digest(seed, ids[:k])``, chained one id at a time, so it
does not depend on how the ids were split into chunks: the state carries the digest and extends
it with each chunk, and a client that sends only its whole output can be matched at any chunk end
(``longest_prefix``). Entries are checked out (removed) while a request uses them, so two requests
never advance one state at once. Correctness never depends on the cache: a miss means the caller
falls back to the state the client sent.

Digests are 16-byte BLAKE2b: the seed binds model, config, parse context, request id and choice,
so matching another stream's key needs a second preimage (2**128 work), not a collision.
"""

from __future__ import annotations

import hashlib
import struct
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from typing import Final, Generic, TypeVar

import msgspec

__all__ = ["DIGEST_SIZE", "CacheStats", "ParserCache", "running_digest", "seed_digest"]

DIGEST_SIZE: Final = 16
_SEED_PERSON: Final = b"rs.seed"
_STEP_PERSON: Final = b"rs.step"
_ID: Final = struct.Struct("<I")
_LEN: Final = struct.Struct("<Q")
# Expired entries removed per check_in: enough to outpace arrivals, small enough to stay O(1).
_SWEEP: Final = 8

V = TypeVar("V")


def seed_digest(*parts: bytes) -> bytes:
    """The digest before any output id, over length-prefixed ``parts`` (so parts cannot blur)."""
    h = hashlib.blake2b(digest_size=DIGEST_SIZE, person=_SEED_PERSON)
    for part in parts:
        h.update(_LEN.pack(len(part)))
        h.update(part)
    return h.digest()


def running_digest(seed: bytes, token_ids: Sequence[int]) -> bytes:
    """``seed`` (a seed or an earlier running digest) extended by ``token_ids``, one at a time.

    ``running_digest(running_digest(s, a), b)`` equals ``running_digest(s, a + b)`` for any
    split. Ids must lie in ``[0, 2**32)``, else ValueError.
    """
    digest = seed
    try:
        for token_id in token_ids:
            digest = _step(digest, token_id)
    except struct.error as exc:
        raise _bad_ids(token_ids) from exc
    return digest


def _step(digest: bytes, token_id: int) -> bytes:
    step = _STEP.copy()
    step.update(digest + _ID.pack(token_id))
    return step.digest()


# Personalized once: copying it costs half of making a new one with the same parameters.
_STEP: Final = hashlib.blake2b(digest_size=DIGEST_SIZE, person=_STEP_PERSON)


def _bad_ids(token_ids: Sequence[int]) -> ValueError:
    bad = next((i for i in token_ids if not 0 <= i < 2**32), None)
    return ValueError(f"token id {bad} is outside [0, 2**32)")


class CacheStats(msgspec.Struct, frozen=True, gc=False):
    """Counters since the cache was made, and its current size."""

    hits: int
    misses: int
    evictions: int
    expirations: int
    size: int
    #: The entries' estimated memory (what ``max_bytes`` bounds).
    bytes: int = 0


class ParserCache(Generic[V]):
    """A bounded, expiring, thread-safe map from running digest to a checked-in stream state.

    ``max_entries`` and ``max_bytes`` bound the size (least recently checked-in goes first; 0
    entries disables the cache; each entry's bytes are its caller's estimate); ``ttl_seconds``
    is how long an entry lives after its check-in; ``clock`` is injectable for tests and must
    not go backwards. Values must not be None (None means "not cached").
    """

    def __init__(
        self,
        max_entries: int,
        ttl_seconds: float,
        clock: Callable[[], float] = time.monotonic,
        max_bytes: int = 64 * 1024 * 1024,
    ) -> None:
        if max_entries < 0:
            raise ValueError(f"max_entries must be >= 0, not {max_entries}")
        if ttl_seconds <= 0:
            raise ValueError(f"ttl_seconds must be > 0, not {ttl_seconds}")
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self.ttl_seconds = ttl_seconds
        self._bytes = 0
        self._clock = clock
        self._lock = threading.Lock()
        # Insertion order is check-in order, hence also expiry order (one TTL for all entries).
        self._entries: OrderedDict[bytes, tuple[float, int, V]] = OrderedDict()
        self._hits = 0
        self._misses = 0
        self._evictions = 0
        self._expirations = 0

    def check_out(self, key: bytes) -> V | None:
        """Remove and return the entry at ``key``, or None if absent or expired."""
        now = self._clock()
        with self._lock:
            value = self._take(key, now)
            if value is None:
                self._misses += 1
            else:
                self._hits += 1
            return value

    def check_in(self, key: bytes, value: V, size: int = 0) -> None:
        """Store ``value`` (about ``size`` bytes) at ``key``, replacing any entry, then sweep
        and evict to bound the count and the bytes. An entry over the whole budget is dropped."""
        self.check_in_many(((key, value, size),))

    def check_in_many(self, items: Iterable[tuple[bytes, V, int]]) -> None:
        """``check_in`` of each ``(key, value, size)`` in order, under one lock and one clock
        reading (a multi-stream call checks in one entry per stream)."""
        if self.max_entries == 0:
            return
        now = self._clock()
        expires = now + self.ttl_seconds
        with self._lock:
            entries = self._entries
            for key, value, size in items:
                if size > self.max_bytes:
                    continue
                old = entries.pop(key, None)
                if old is not None:
                    self._bytes -= old[1]
                entries[key] = (expires, size, value)
                self._bytes += size
                for _ in range(_SWEEP):
                    oldest = next(iter(entries.values()))
                    if oldest[0] > now:
                        break
                    self._bytes -= entries.popitem(last=False)[1][1]
                    self._expirations += 1
                while len(entries) > self.max_entries or self._bytes > self.max_bytes:
                    self._bytes -= entries.popitem(last=False)[1][1]
                    self._evictions += 1

    def longest_prefix(self, seed: bytes, history: Sequence[int]) -> tuple[int, V] | None:
        """Check out the entry at the longest cached prefix of ``history`` under ``seed``.

        Returns ``(k, value)`` where ``k`` ids of ``history`` are covered by the entry (0 for the
        seed itself), or None. Costs one hash per id, done outside the lock; ValueError for an
        id outside ``[0, 2**32)``.
        """
        digests = [seed]
        digest = seed
        try:
            for token_id in history:
                digest = _step(digest, token_id)
                digests.append(digest)
        except struct.error as exc:
            raise _bad_ids(history) from exc
        now = self._clock()
        with self._lock:
            for k in range(len(digests) - 1, -1, -1):
                if digests[k] in self._entries:
                    value = self._take(digests[k], now)
                    if value is not None:
                        self._hits += 1
                        return k, value
            self._misses += 1
            return None

    def stats(self) -> CacheStats:
        """A snapshot of the counters."""
        with self._lock:
            return CacheStats(
                hits=self._hits,
                misses=self._misses,
                evictions=self._evictions,
                expirations=self._expirations,
                size=len(self._entries),
                bytes=self._bytes,
            )

    def _take(self, key: bytes, now: float) -> V | None:
        # Caller holds the lock. An expired entry is removed and reported as absent.
        entry = self._entries.pop(key, None)
        if entry is None:
            return None
        self._bytes -= entry[1]
        if entry[0] <= now:
            self._expirations += 1
            return None
        return entry[2]
