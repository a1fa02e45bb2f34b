"""Process lifecycle for load balancers: readiness flips to "draining" when shutdown begins.

uvicorn owns SIGTERM and SIGINT: its handler stops the accept loop, lets in-flight requests
finish (bounded by ``timeout_graceful_shutdown``) and then exits. ``chain_drain_signal`` slips a
step in front of that handler so ``/ready`` answers 503 from the first moment of the drain, while
``/health`` (liveness) stays 200 until the process is gone. That relies on when uvicorn installs
its handlers (before it calls the app factory), which is why pyproject.toml pins uvicorn to the
tested minor release.
"""

from __future__ import annotations

import logging
import signal
import threading
from collections.abc import Callable
from types import FrameType
from typing import Any

log = logging.getLogger("render_service")
_draining = threading.Event()
DRAIN_SIGNALS = (signal.SIGTERM, signal.SIGINT)


def draining() -> bool:
    return _draining.is_set()


def begin_drain() -> None:
    if not _draining.is_set():
        _draining.set()
        log.info("draining: /ready now answers 503; finishing in-flight requests")


def chain_drain_signal() -> bool:
    """Mark the process draining before the current SIGTERM/SIGINT handlers run.

    Call it after uvicorn installed its handlers (the app factory runs inside uvicorn's
    ``capture_signals``). Returns False, and changes nothing, off the main thread or when a
    signal has no Python handler to chain to.
    """
    if threading.current_thread() is not threading.main_thread():
        return False
    chained = False
    for sig in DRAIN_SIGNALS:
        previous = signal.getsignal(sig)
        if not callable(previous):
            continue

        signal.signal(sig, _chained(previous))
        chained = True
    return chained


def _chained(previous: Callable[[int, FrameType | None], Any]) -> Callable[..., None]:
    def handler(signum: int, frame: FrameType | None) -> None:
        begin_drain()
        previous(signum, frame)

    return handler
