"""Prometheus metrics, JSON access logs and request ids: one ASGI middleware plus a few hooks.

The middleware counts every HTTP request by endpoint, method and status, times it, echoes (or
mints) ``X-Request-Id`` and writes one JSON access-log line. The hooks below are what the render
and derender code calls to count work the middleware cannot see in a response status:

    tokens_rendered(n)      prompt ids produced by a render
    mm_items(modality, n)   multimodal items (images, ...) in a render
    derender_chunk(tokens, chunks)  derender chunks (one per call or per stream of a
                            multi-stream call) and the generated ids they consumed
    observe_derender(body, cache)  derender_chunk read off a derender body, plus the parser
                            cache's own counters (so the cache itself needs no hooks)
    cache_event(kind)       parser-cache "hit" | "miss" | "eviction" | "expiration", for a cache
                            not reported through observe_derender (never both)
    in_pool(fn)             wraps a callable bound for the worker pool (queue depth, busy workers)

With ``--workers N`` > 1 every process writes its samples to files in
``PROMETHEUS_MULTIPROC_DIR`` (set by render_service.http.server before the workers start) and a scrape
of ``/metrics`` on any process aggregates all of them; see docs/deployment.md.
"""

from __future__ import annotations

import os
import random
import time
import weakref
from collections.abc import Callable, Iterable
from typing import Any, Literal, TextIO, TypeVar

import msgspec
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    disable_created_metrics,
    generate_latest,
    multiprocess,
)
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from render_service.caches import CacheSize

T = TypeVar("T")
CacheEvent = Literal["hit", "miss", "eviction", "expiration"]
_CACHE_EVENT_NAMES: tuple[CacheEvent, ...] = ("hit", "miss", "eviction", "expiration")

# prometheus_client itself switches to file-backed values when this variable is set at import.
MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"
_multiprocess = bool(os.environ.get(MULTIPROC_ENV))

_registry = CollectorRegistry()
disable_created_metrics()  # type: ignore[no-untyped-call]  # *_created series only double a scrape
# Render latency spans ~0.2 ms (a short chat) to seconds (a huge prompt or an image).
_LATENCY_BUCKETS = (
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
)

REQUESTS = Counter(
    "render_service_requests",
    "HTTP requests by endpoint, method and status code.",
    ["endpoint", "method", "status"],
    registry=_registry,
)
LATENCY = Histogram(
    "render_service_request_duration_seconds",
    "Time from request start to the last response byte, by endpoint.",
    ["endpoint"],
    buckets=_LATENCY_BUCKETS,
    registry=_registry,
)
IN_FLIGHT = Gauge(
    "render_service_requests_in_flight",
    "HTTP requests being handled now.",
    registry=_registry,
    multiprocess_mode="livesum",
)
TOKENS_RENDERED = Counter(
    "render_service_rendered_tokens",
    "Prompt token ids produced by render endpoints.",
    registry=_registry,
)
MM_ITEMS = Counter(
    "render_service_mm_items",
    "Multimodal items (images, ...) rendered, by modality.",
    ["modality"],
    registry=_registry,
)
DERENDER_CHUNKS = Counter(
    "render_service_derender_chunks",
    "Derender calls (one per streamed chunk, one per batch request).",
    registry=_registry,
)
DERENDER_TOKENS = Counter(
    "render_service_derendered_tokens",
    "Generated token ids consumed by derender.",
    registry=_registry,
)
PARSER_CACHE = Counter(
    "render_service_parser_cache_events",
    "Parser-state cache lookups and removals, by event (hit, miss, eviction, expiration).",
    ["event"],
    registry=_registry,
)
PARSER_CACHE_ENTRIES = Gauge(
    "render_service_parser_cache_entries",
    "Stream states held in the parser cache now (summed over processes).",
    registry=_registry,
    multiprocess_mode="livesum",
)
CACHE_BYTES = Gauge(
    "render_service_cache_bytes",
    "Estimated memory of each per-process cache, by cache (summed over processes).",
    ["cache"],
    registry=_registry,
    multiprocess_mode="livesum",
)
CACHE_ENTRIES = Gauge(
    "render_service_cache_entries",
    "Entries of each per-process cache, by cache (summed over processes).",
    ["cache"],
    registry=_registry,
    multiprocess_mode="livesum",
)
POOL_QUEUED = Gauge(
    "render_service_worker_pool_queued",
    "Tasks waiting for a worker thread.",
    registry=_registry,
    multiprocess_mode="livesum",
)
POOL_BUSY = Gauge(
    "render_service_worker_pool_busy",
    "Worker threads running a task.",
    registry=_registry,
    multiprocess_mode="livesum",
)
POOL_SIZE = Gauge(
    "render_service_worker_pool_size",
    "Worker threads (--renderer-num-workers, summed over processes).",
    registry=_registry,
    multiprocess_mode="livesum",
)

# Prebound children: the hot path should not look up labels it always uses.
_CACHE_EVENTS = {event: PARSER_CACHE.labels(event) for event in _CACHE_EVENT_NAMES}
for _child in _CACHE_EVENTS.values():
    _child.inc(0)  # make the series exist at zero so rate() works from the first scrape


# ---- hooks -----------------------------------------------------------------------------------


def tokens_rendered(count: int) -> None:
    TOKENS_RENDERED.inc(count)


def mm_items(modality: str, count: int = 1) -> None:
    MM_ITEMS.labels(modality).inc(count)


def derender_chunk(tokens: int = 0, chunks: int = 1) -> None:
    DERENDER_CHUNKS.inc(chunks)
    if tokens:
        DERENDER_TOKENS.inc(tokens)


def cache_event(kind: CacheEvent) -> None:
    _CACHE_EVENTS[kind].inc()


def observe_render(results: Iterable[Any]) -> None:
    """Count the prompt ids and multimodal items of rendered GenerateRequests."""
    for result in results:
        tokens_rendered(len(result.token_ids))
        features = result.features
        if features:
            for modality, hashes in (features.get("mm_hashes") or {}).items():
                mm_items(modality, len(hashes))


def observe_derender(body: Any, cache: Any) -> None:
    """Count one derender call and its generated ids; catch up with the parser cache's counters.

    ``body`` is any derender request (one ``generate_chunk``, one ``generate_response`` or a list
    of ``generate_responses``); ``cache.stats()`` has cumulative ``hits``, ``misses``,
    ``evictions``, ``expirations`` and the current ``size``. Called on the event loop only.
    """
    items = getattr(body, "items", None)  # a multi-stream derender: one chunk per stream
    tokens = 0
    for item in items if items is not None else (body,):
        responses = (
            getattr(item, "generate_responses", None)
            or getattr(item, "generate_chunks", None)
            or [getattr(item, "generate_chunk", None) or getattr(item, "generate_response", None)]
        )
        for response in responses:
            for choice in getattr(response, "choices", None) or ():
                tokens += len(choice.token_ids or ())
    # One update per call, not per item (each is a locked, in multiprocess mode a file, write).
    derender_chunk(tokens, len(items) if items is not None else 1)
    stats = cache.stats()
    # Each cache's cumulative counters as last reported, so each call adds only what is new.
    seen = _cache_seen.get(cache)
    if seen is None:
        seen = _cache_seen[cache] = dict.fromkeys(_CACHE_EVENT_NAMES, 0)
    for event, field in zip(_CACHE_EVENT_NAMES, _CACHE_STATS_FIELDS, strict=True):
        total = getattr(stats, field)
        if total > seen[event]:
            _CACHE_EVENTS[event].inc(total - seen[event])
            seen[event] = total
    _parser_cache_entries.set(stats.size)


def observe_caches(sizes: Iterable[CacheSize]) -> None:
    """Set each cache's size gauges (called after requests that may change them).

    Each cache's two gauges are looked up once, and set only when the size moved: a render
    used to pay 14 label lookups and 14 locked writes for mostly unchanged sizes."""
    for size in sizes:
        gauges = _cache_gauges.get(size.name)
        if gauges is None:
            gauges = _cache_gauges[size.name] = (
                _MovingGauge(CACHE_BYTES.labels(size.name)),
                _MovingGauge(CACHE_ENTRIES.labels(size.name)),
            )
        gauges[0].set(size.bytes)
        gauges[1].set(size.entries)


class _MovingGauge:
    """A gauge written only when its value moves: in multiprocess mode every write is a locked
    write to this process's metrics file."""

    __slots__ = ("gauge", "value")

    def __init__(self, gauge: Gauge) -> None:
        self.gauge = gauge
        self.value = -1  # never a size: the first set always writes

    def set(self, value: int) -> None:
        if value != self.value:
            self.gauge.set(value)
            self.value = value


_cache_gauges: dict[str, tuple[_MovingGauge, _MovingGauge]] = {}
_parser_cache_entries = _MovingGauge(PARSER_CACHE_ENTRIES)


_CACHE_STATS_FIELDS = ("hits", "misses", "evictions", "expirations")
_cache_seen: weakref.WeakKeyDictionary[Any, dict[str, int]] = weakref.WeakKeyDictionary()


def pool_size(workers: int) -> None:
    POOL_SIZE.set(workers)


def in_pool(fn: Callable[[], T]) -> Callable[[], T]:
    """Count ``fn`` as queued now and as busy while a worker runs it."""
    POOL_QUEUED.inc()

    def run() -> T:
        POOL_QUEUED.dec()
        POOL_BUSY.inc()
        try:
            return fn()
        finally:
            POOL_BUSY.dec()

    return run


# ---- exposition --------------------------------------------------------------------------------


def exposition() -> bytes:
    """The text exposition of every metric, aggregated over processes in multiprocess mode."""
    if _multiprocess:
        registry = CollectorRegistry()
        multiprocess.MultiProcessCollector(registry)  # type: ignore[no-untyped-call]
        return generate_latest(registry)
    return generate_latest(_registry)


async def metrics_endpoint(request: Request) -> Response:
    return Response(exposition(), media_type=CONTENT_TYPE_LATEST)


# ---- middleware --------------------------------------------------------------------------------

_PROBES = frozenset({"/health", "/ready", "/metrics"})
_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})
_UNMATCHED = "unmatched"
_json = msgspec.json.Encoder()


class AccessLog:
    """Where access lines go: one JSON object per line on a text stream, or nowhere (the default).

    Written directly rather than through ``logging``: a LogRecord per request costs more than
    everything else this middleware does.
    """

    def __init__(self) -> None:
        self.stream: TextIO | None = None
        self.probes = False

    def configure(self, stream: TextIO | None, *, probes: bool = False) -> None:
        """Send lines to ``stream`` (None: off); ``probes`` also logs /health, /ready, /metrics."""
        self.stream = stream
        self.probes = probes


access_log = AccessLog()


class AccessLine(msgspec.Struct):
    """One access-log record; never carries bodies, prompts or model output."""

    ts: float
    request_id: str
    method: str
    path: str
    status: int
    duration_ms: float
    bytes_in: int
    bytes_out: int
    client: str | None


# A minted request id only tells log lines apart: drawn from a generator seeded by the OS once
# per process (secrets.token_hex is a system call per request, ~4% of a streamed chunk's app).
_ids = random.Random()


def request_id_of(scope: Scope) -> str:
    """The request's ``X-Request-Id``, or a minted one."""
    for name, value in scope["headers"]:
        if name == b"x-request-id":
            return str(value.decode("latin-1"))
    return f"{_ids.getrandbits(64):016x}"  # vLLM's random ids are 16 hex digits too


class RequestMetrics:
    """Counts, times and logs HTTP requests: what ``MetricsMiddleware`` does around an ASGI
    request, and the protocol's direct routes (http.direct) around theirs.

    ``endpoints`` are the app's route paths; anything else is labelled ``unmatched`` so a scan of
    random URLs cannot blow up the label set.
    """

    def __init__(self, endpoints: Iterable[str]) -> None:
        self.endpoints = frozenset(endpoints)
        # Label lookups cost more than the increments; every key here is from a bounded set.
        self._requests: dict[tuple[str, str, int], Any] = {}
        self._latency: dict[str, Any] = {}

    def begin(self) -> float:
        """A request starts: count it in flight; returns its start time."""
        IN_FLIGHT.inc()
        return time.perf_counter()

    def end(
        self,
        scope: Scope,
        start: float,
        request_id: str,
        status: int,
        bytes_in: int,
        bytes_out: int,
    ) -> None:
        """A request ended (answered, or failed with ``status``): count, time and log it."""
        IN_FLIGHT.dec()
        elapsed = time.perf_counter() - start
        path: str = scope["path"]
        endpoint = path if path in self.endpoints else _UNMATCHED
        method = scope["method"] if scope["method"] in _METHODS else "other"
        self._count(endpoint, method, status, elapsed)
        stream = access_log.stream
        if stream is not None and (access_log.probes or path not in _PROBES):
            client = scope.get("client")
            line = AccessLine(
                ts=round(time.time(), 3),
                request_id=request_id,
                method=method,
                path=path[:256],
                status=status,
                duration_ms=round(elapsed * 1000, 3),
                bytes_in=bytes_in,
                bytes_out=bytes_out,
                client=f"{client[0]}:{client[1]}" if client else None,
            )
            stream.write(_json.encode(line).decode() + "\n")

    def _count(self, endpoint: str, method: str, status: int, elapsed: float) -> None:
        key = (endpoint, method, status)
        requests = self._requests.get(key)
        if requests is None:
            requests = self._requests[key] = REQUESTS.labels(endpoint, method, str(status))
        requests.inc()
        latency = self._latency.get(endpoint)
        if latency is None:
            latency = self._latency[endpoint] = LATENCY.labels(endpoint)
        latency.observe(elapsed)


class MetricsMiddleware:
    """Counts, times and logs every HTTP request (``RequestMetrics``) and echoes its
    ``X-Request-Id``."""

    def __init__(self, app: ASGIApp, requests: RequestMetrics) -> None:
        self.app = app
        self.requests = requests

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self.app(scope, _on_shutdown(receive), send)
            return
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        request_id = request_id_of(scope)
        header = (b"x-request-id", request_id.encode("latin-1"))
        status = 500
        bytes_in = 0
        bytes_out = 0

        async def counting_receive() -> Message:
            nonlocal bytes_in
            message = await receive()
            bytes_in += len(message.get("body", b""))
            return message

        async def tagging_send(message: Message) -> None:
            nonlocal status, bytes_out
            if message["type"] == "http.response.start":
                status = message["status"]
                message["headers"] = [*message.get("headers", ()), header]
            elif message["type"] == "http.response.body":
                bytes_out += len(message.get("body", b""))
            await send(message)

        start = self.requests.begin()
        try:
            await self.app(scope, counting_receive, tagging_send)
        finally:
            self.requests.end(scope, start, request_id, status, bytes_in, bytes_out)


def _on_shutdown(receive: Receive) -> Receive:
    """Forget this process's live gauges when the app shuts down (multiprocess mode only)."""

    async def wrapped() -> Message:
        message = await receive()
        if message["type"] == "lifespan.shutdown" and _multiprocess:
            multiprocess.mark_process_dead(os.getpid())  # type: ignore[no-untyped-call]
        return message

    return wrapped
