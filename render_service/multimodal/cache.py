"""Processed images kept by content, so an image sent again skips decoding and resizing.

Chat clients resend every earlier image on every turn. The key is the image's content hash
(model, bytes, decoder and processor settings; never the client's uuid, which a client could
reuse for other bytes) plus the processor configuration; the value is the patch rows, which
the next request copies into its own serialized item (the item records that request's batch
layout, so it is not itself reusable).
"""

from __future__ import annotations

import functools
import threading
from collections import OrderedDict
from collections.abc import Hashable

import msgspec
import numpy as np
from numpy.typing import NDArray

from render_service.caches import CacheSize


class Patches(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    rows: NDArray[np.uint8]  # read-only
    grid_thw: tuple[int, int, int]
    num_tokens: int


class PatchCache:
    """A thread-safe LRU of ``Patches`` bounded by the bytes of their rows."""

    def __init__(self, capacity_bytes: int) -> None:
        self.capacity_bytes = capacity_bytes
        self.size_bytes = 0
        self.hits = 0
        self._entries: OrderedDict[Hashable, Patches] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: Hashable) -> Patches | None:
        with self._lock:
            found = self._entries.get(key)
            if found is not None:
                self._entries.move_to_end(key)
                self.hits += 1
            return found

    def put(self, key: Hashable, patches: Patches) -> None:
        size = patches.rows.nbytes
        if size > self.capacity_bytes:
            return
        patches.rows.flags.writeable = False
        with self._lock:
            previous = self._entries.pop(key, None)
            if previous is not None:
                self.size_bytes -= previous.rows.nbytes
            while self._entries and self.size_bytes + size > self.capacity_bytes:
                _, evicted = self._entries.popitem(last=False)
                self.size_bytes -= evicted.rows.nbytes
            self._entries[key] = patches
            self.size_bytes += size

    def size(self) -> CacheSize:
        return CacheSize(name="images", entries=len(self._entries), bytes=self.size_bytes)


@functools.cache
def patch_cache(capacity_bytes: int) -> PatchCache:
    """The process's cache (one per capacity, so media workers of one server share it)."""
    return PatchCache(capacity_bytes)
