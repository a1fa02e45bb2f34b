"""Abandoned requests: CPU work in a worker thread learns that no one waits for its answer.

The HTTP layer runs each request's work under an event (``run_abandonable``) and sets it when
the request is cancelled (its timeout, or the client left). Long loops in the core call
``check_abandoned`` between slices of work and stop with :class:`RequestAbandoned`.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from contextvars import ContextVar
from typing import Any, TypeVar

from render_service.errors import RequestAbandoned

__all__ = ["check_abandoned", "run_abandonable"]

T = TypeVar("T")
_EVENT: ContextVar[threading.Event | None] = ContextVar("render_service_abandoned", default=None)


def run_abandonable(event: threading.Event, fn: Callable[..., T], *args: Any) -> T:
    """``fn(*args)`` in this thread, with ``check_abandoned`` watching ``event``."""
    token = _EVENT.set(event)
    try:
        return fn(*args)
    finally:
        _EVENT.reset(token)


def check_abandoned() -> None:
    """RequestAbandoned once the current request's event is set (never outside a request)."""
    event = _EVENT.get()
    if event is not None and event.is_set():
        raise RequestAbandoned("The request was abandoned before its work finished.")
