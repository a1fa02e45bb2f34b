"""Deadlines of one length on one event loop, served by one loop timer.

Arming and cancelling an event-loop timer costs ~10-30 µs on uvloop (a libuv timer each time),
and the server did it per request, twice (an ``asyncio.timeout`` scope for --request-timeout, a
``call_later`` for --header-timeout), for deadlines that almost never expire. With one length,
deadlines expire in the order they start, so one timer waiting for the oldest serves them all:
starting and stopping one is a dict insert and a dict pop.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable

__all__ = ["Deadlines"]


class Deadlines:
    """Callbacks each run ``seconds`` after its ``start``, unless stopped first."""

    def __init__(self, loop: asyncio.AbstractEventLoop, seconds: float) -> None:
        self.loop = loop
        self.seconds = seconds
        # Insertion order is deadline order: one length, a monotonic clock.
        self._pending: dict[int, tuple[float, Callable[[], object]]] = {}
        self._timer: asyncio.TimerHandle | None = None
        self._keys = itertools.count()

    @classmethod
    def of(cls, current: Deadlines | None, seconds: float) -> Deadlines:
        """``current`` if it serves the running loop with ``seconds``, else a new one (the old
        one's timer still serves what was started on it)."""
        loop = asyncio.get_running_loop()
        if current is not None and current.loop is loop and current.seconds == seconds:
            return current
        return cls(loop, seconds)

    def start(self, callback: Callable[[], object]) -> int:
        """Run ``callback`` in ``seconds`` unless stopped; the key to ``stop`` it with."""
        key = next(self._keys)
        deadline = self.loop.time() + self.seconds
        self._pending[key] = (deadline, callback)
        if self._timer is None:
            self._timer = self.loop.call_at(deadline, self._expire)
        return key

    def stop(self, key: int) -> bool:
        """Stop a deadline: False if its callback has already run."""
        return self._pending.pop(key, None) is not None

    def _expire(self) -> None:
        self._timer = None
        now = self.loop.time()
        while self._pending:
            key = next(iter(self._pending))
            deadline, callback = self._pending[key]
            if deadline > now:
                self._timer = self.loop.call_at(deadline, self._expire)
                return
            del self._pending[key]
            callback()
