"""A least-recently-used map bounded by bytes, for the per-process caches that are not keyed by
stream (parsers by tool set, template facts, logprob token texts).

Each entry's size is its caller's estimate of the memory it holds (key and value); the map
evicts the least recently used entries until the total fits ``max_bytes``, and never keeps an
entry larger than the whole budget. ``CacheSize`` is what /metrics reports for every cache.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Hashable
from typing import Generic, TypeVar

import msgspec

__all__ = ["ByteLRU", "CacheSize"]

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class CacheSize(msgspec.Struct, frozen=True, gc=False):
    """One cache's size now: its entries and their estimated bytes."""

    name: str
    entries: int
    bytes: int


class ByteLRU(Generic[K, V]):
    """A thread-safe LRU map whose entries' estimated sizes add up to at most ``max_bytes``
    (0 turns the cache off)."""

    def __init__(self, name: str, max_bytes: int) -> None:
        if max_bytes < 0:
            raise ValueError(f"max_bytes must be >= 0, not {max_bytes}")
        self.name = name
        self.max_bytes = max_bytes
        self._bytes = 0
        self._lock = threading.Lock()
        self._entries: OrderedDict[K, tuple[int, V]] = OrderedDict()

    def get(self, key: K) -> V | None:
        """The value at ``key`` (now the most recently used), or None."""
        with self._lock:
            entry = self._entries.get(key)
            if entry is None:
                return None
            self._entries.move_to_end(key)
            return entry[1]

    def put(self, key: K, value: V, size: int) -> None:
        """Keep ``value`` (about ``size`` bytes) at ``key``, evicting the least recently used."""
        if size > self.max_bytes:
            return
        with self._lock:
            old = self._entries.pop(key, None)
            if old is not None:
                self._bytes -= old[0]
            self._entries[key] = (size, value)
            self._bytes += size
            while self._bytes > self.max_bytes:
                self._bytes -= self._entries.popitem(last=False)[1][0]

    def resize(self, max_bytes: int) -> None:
        """A new budget (evicting down to it)."""
        with self._lock:
            self.max_bytes = max_bytes
            while self._bytes > max_bytes and self._entries:
                self._bytes -= self._entries.popitem(last=False)[1][0]

    def size(self) -> CacheSize:
        return CacheSize(name=self.name, entries=len(self._entries), bytes=self._bytes)

    def __len__(self) -> int:
        return len(self._entries)
