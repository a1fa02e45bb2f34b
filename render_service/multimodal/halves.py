"""Splitting one image's work in two, so a lone image uses two cores."""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor


class Helper:
    """A spare thread that takes the second half of a step when it is idle.

    It never queues: when it is busy with another image's half, the caller does the whole
    step itself, so a loaded server loses nothing to waiting and an idle one gains a core.
    """

    def __init__(self, initializer: Callable[[], None] | None = None) -> None:
        self._thread = ThreadPoolExecutor(
            1, thread_name_prefix="media-helper", initializer=initializer
        )
        self._idle = threading.Lock()

    def over_halves(self, step: Callable[[int, int], None], size: int) -> None:
        if size < 2 or not self._idle.acquire(blocking=False):
            step(0, size)
            return
        try:
            second = self._thread.submit(step, size // 2, size)
            try:
                step(0, size // 2)
            finally:
                second.result()  # never leave a thread writing into buffers the caller gets back
        finally:
            self._idle.release()


def over_halves(helper: Helper | None, step: Callable[[int, int], None], size: int) -> None:
    """``step(start, stop)`` over ``[0, size)``, half of it on ``helper`` if it is free.

    The steps must write disjoint parts of their output (rows of an image, say).
    """
    if helper is None:
        step(0, size)
    else:
        helper.over_halves(step, size)
