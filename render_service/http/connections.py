"""Connection limits below the app: header size, header count, header time, connections.

uvicorn's httptools protocol has none of them: one request may carry any number of headers of
any size, a client may take forever to finish its headers (slowloris), and a process accepts
every connection. ``LimitedHttpToolsProtocol`` adds the four, per server process:

- the request line and headers of one request at most ``--max-header-bytes`` (431), counted as
  the parser reports them and, while headers are still arriving, as raw bytes received (so a
  header that never ends is refused as soon as it is too long);
- at most ``--max-headers`` headers (431);
- a request whose headers are not complete ``--header-timeout`` seconds after its connection
  opened (or after its first byte, on a kept-alive connection) gets a 408 and is closed;
- at most ``--max-connections`` open connections: the next one gets a 503 and is closed.

Each refusal is vLLM's error body with ``Connection: close``, followed by a lingering close as
nginx does it: the server stops writing and reads and drops what the client still sends (at
most ``_LINGER_BYTES`` for ``_LINGER_SECONDS``), since closing a socket with unread input
resets the connection and the client may never read the answer. An app response that completes
before its request's body has all arrived (the 413 of --max-body-bytes, a 408) ends the same
way: the rest of the body is dropped unparsed and the connection closes. uvicorn is given the
class by its import path; the worker's app factory sets the limits (``configure``) before uvicorn
serves.
"""

from __future__ import annotations

import asyncio
import logging
from functools import partial
from typing import Any

import msgspec
from starlette.types import Receive, Scope, Send
from uvicorn.protocols.http.httptools_impl import (
    HEADER_VALUE_RE,
    STATUS_LINE,
    HttpToolsProtocol,
    RequestResponseCycle,
)

from render_service.http import lifecycle
from render_service.http.deadlines import Deadlines
from render_service.http.direct import Direct
from render_service.http.errors import Handler
from render_service.protocol.server import ErrorInfo, ErrorResponse
from render_service.settings import DEFAULTS, Settings

__all__ = [
    "PROTOCOL",
    "ConnectionLimits",
    "LimitedHttpToolsProtocol",
    "configure",
    "serve_directly",
]

#: What uvicorn is given as ``http``: this module's protocol class.
PROTOCOL = "render_service.http.connections:LimitedHttpToolsProtocol"
log = logging.getLogger("render_service")
# Each header line costs its name, its value, ": " and CRLF; the request line its URL plus
# method and version (at most this many bytes).
_LINE_OVERHEAD = 4
_REQUEST_LINE_OVERHEAD = 24
_LINGER_SECONDS = 5.0
_LINGER_BYTES = 64 * 1024 * 1024
# A response head up to this size is held for its body (_CycleTransport); a body up to this
# size is copied behind it into one buffer, a larger one goes out in the same vectored write.
_HOLD_BYTES = 16 * 1024
_JOIN_BYTES = 64 * 1024


class ConnectionLimits(msgspec.Struct, frozen=True, kw_only=True):
    """The connection limits of one server process (see the module docstring)."""

    max_header_bytes: int = DEFAULTS["max_header_bytes"]
    max_headers: int = DEFAULTS["max_headers"]
    header_timeout: float = DEFAULTS["header_timeout"]
    max_connections: int = DEFAULTS["max_connections"]

    @classmethod
    def from_settings(cls, settings: Settings) -> ConnectionLimits:
        return cls(
            max_header_bytes=settings.max_header_bytes,
            max_headers=settings.max_headers,
            header_timeout=settings.header_timeout,
            max_connections=settings.max_connections,
        )


_limits = ConnectionLimits()
# The app's direct routes (http.direct), None: every request goes the ASGI way.
_direct: Direct | None = None
# A request carrying one of these goes the ASGI way: a chunked or upgraded body, and the
# headers uvicorn's proxy-headers middleware rewrites the client address or scheme from.
_ASGI_HEADERS = frozenset(
    {b"transfer-encoding", b"upgrade", b"x-forwarded-for", b"x-forwarded-proto"}
)
# Every connection's header deadline, on one loop timer (armed once per request otherwise).
_header_deadlines: Deadlines | None = None


def configure(limits: ConnectionLimits) -> None:
    """Set this process's limits (the app factory calls it once, before uvicorn serves)."""
    global _limits
    _limits = limits


def serve_directly(direct: Direct | None) -> None:
    """Answer ``direct``'s routes from the protocol in the plain case (the app factory calls it
    once, before uvicorn serves; None turns it off)."""
    global _direct
    _direct = direct


class _Refused(Exception):
    """Raised inside a parser callback to stop parsing a request that broke a limit."""


def _refusal(status: int, message: str, error_type: str) -> bytes:
    body = msgspec.json.encode(
        ErrorResponse(error=ErrorInfo(message=message, type=error_type, code=status))
    )
    return b"".join(
        (
            STATUS_LINE[status],
            b"content-type: application/json\r\n",
            b"content-length: %d\r\n" % len(body),
            b"connection: close\r\n\r\n",
            body,
        )
    )


class LimitedHttpToolsProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with the limits of ``configure``."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._limits = _limits
        self._awaiting_headers = True
        self._raw_header_bytes = 0
        self._header_bytes = 0
        self._header_count = 0
        self._header_timer: int | None = None  # its key in _deadlines
        self._deadlines: Deadlines | None = None
        self._refused: bytes | None = None
        self._lingering = False
        self._discarded = 0
        self._cycle_transport: _CycleTransport | None = None
        # A direct route's handler (http.direct), from the request's headers to its task.
        self._direct_handler: Handler | None = None
        self.logger = _RefusalAwareLogger(self.logger, self)  # type: ignore[assignment]

    # ---- connections ----------------------------------------------------------------------

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        limit = self._limits.max_connections
        if limit and len(self.connections) > limit:
            log.warning("refused a connection: the limit of %d open connections is reached", limit)
            self._refuse(
                503,
                f"This server process has {limit} open connections, its limit "
                "(--max-connections); retry later.",
                "ServiceUnavailableError",
            )
            return
        self._arm_header_timer()

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_header_timer()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._lingering:  # answered and closing: drop the input, parse nothing
            self._discarded += len(data)
            if self._discarded > _LINGER_BYTES:
                self.transport.close()
            return
        if self._awaiting_headers:
            self._raw_header_bytes += len(data)
        super().data_received(data)
        if (
            self._refused is None
            and self._awaiting_headers
            and self._raw_header_bytes > self._limits.max_header_bytes
        ):
            self._refuse_headers_too_large()

    def send_400_response(self, msg: str) -> None:
        """uvicorn's answer to a parser error: ours when a callback stopped the parser."""
        self._flush_held()
        if self._refused is not None:
            self._send_refusal()
        else:
            super().send_400_response(msg)

    # ---- parser callbacks -----------------------------------------------------------------

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._awaiting_headers = True
        self._header_bytes = _REQUEST_LINE_OVERHEAD
        self._header_count = 0
        if self._header_timer is None:
            self._arm_header_timer()

    def on_url(self, url: bytes) -> None:
        self._count(len(url))
        super().on_url(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        self._header_count += 1
        if self._header_count > self._limits.max_headers:
            self._stop(
                f"The request has more than {self._limits.max_headers} headers, this server's "
                "limit (--max-headers)."
            )
        self._count(len(name) + len(value) + _LINE_OVERHEAD)
        super().on_header(name, value)

    def on_headers_complete(self) -> None:
        self._awaiting_headers = False
        self._raw_header_bytes = 0
        self._cancel_header_timer()
        self._direct_handler = self._direct_route()
        super().on_headers_complete()
        self._direct_handler = None
        if self.cycle is not None:  # its task has not run yet: it sees only this transport
            self.cycle.transport = _CycleTransport(self.transport, self)  # type: ignore[assignment]

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if self._body_unfinished():  # a kept-alive answer before the body: close, lingering
            self._linger()

    def on_message_complete(self) -> None:
        super().on_message_complete()
        self._awaiting_headers = True
        self._raw_header_bytes = 0

    def _start_asgi_task(self, cycle: RequestResponseCycle, app: Any) -> None:
        """Start a request's app, or for a direct route its handler without the app. uvicorn's
        task wrapper runs either (its error handling, the task set a shutdown waits on)."""
        handler = self._direct_handler
        if handler is not None:
            self._direct_handler = None
            app = partial(self._serve_direct, cycle, handler)
        super()._start_asgi_task(cycle, app)

    # ---- direct routes (http.direct) ------------------------------------------------------

    def _direct_route(self) -> Handler | None:
        """The direct route's handler for the request whose headers just arrived, if it is the
        plain case: an HTTP/1.1 POST to the exact path with a Content-Length body, no
        Expect: 100-continue, no proxy headers, no request still being answered on this
        connection (pipelining), no root path, not draining. Its body is read as the ASGI app
        reads it (uvicorn's ``receive``), within the request timeout."""
        direct = _direct
        if direct is None:
            return None
        handler = direct.routes.get(self.url)
        if (
            handler is None
            or self.expect_100_continue
            or self.root_path
            or self.limit_concurrency is not None
            or (self.cycle is not None and not self.cycle.response_complete)
            or self.parser.get_method() != b"POST"
            or self.parser.get_http_version() != "1.1"
            or lifecycle.draining()
        ):
            return None
        length = False
        for name, value in self.headers:
            if name == b"content-length":
                length = True
            elif name in _ASGI_HEADERS:
                return None
            elif name == b"x-request-id" and HEADER_VALUE_RE.search(value):
                return None  # uvicorn refuses to echo it: its error, the ASGI way
        return handler if length else None

    async def _serve_direct(
        self,
        cycle: RequestResponseCycle,
        handler: Handler,
        scope: Scope,
        receive: Receive,
        send: Send,
    ) -> None:
        """The ASGI app uvicorn's task wrapper runs for a direct route's request."""
        assert _direct is not None
        await _direct.serve(handler, scope, receive, partial(self._answer, cycle))

    async def _answer(
        self,
        cycle: RequestResponseCycle,
        status: int,
        headers: list[tuple[bytes, bytes]],
        body: bytes | memoryview,
    ) -> None:
        """Write a direct route's answer in one write, head as uvicorn writes it (its default
        server and date headers, ``connection: close`` when the connection ends), and complete
        the cycle as uvicorn's ``send`` does."""
        if cycle.flow.write_paused and not cycle.disconnected:
            await cycle.flow.drain()
        if cycle.disconnected:
            return
        self._flush_held()  # nothing is, unless uvicorn wrote a 100 Continue
        closes = False  # the response says connection: close itself
        content = [STATUS_LINE[status]]
        for name, value in (*cycle.default_headers, *headers):
            if name == b"connection":
                closes = closes or b"close" in [t.lower().strip() for t in value.split(b",")]
            content += (name, b": ", value, b"\r\n")
        keep_alive = cycle.keep_alive and not closes
        if not keep_alive and not closes:
            content.append(b"connection: close\r\n")
        content.append(b"\r\n")
        head = b"".join(content)
        if len(body) <= _JOIN_BYTES:
            self.transport.write(head + body)
        else:  # no copy of a large body
            self.transport.writelines((head, body))
        cycle.response_started = cycle.response_complete = True
        cycle.keep_alive = keep_alive
        cycle.message_event.set()
        if not keep_alive:
            cycle.transport.close()
        cycle.on_response()

    # ---- helpers --------------------------------------------------------------------------

    def _count(self, size: int) -> None:
        self._header_bytes += size
        if self._header_bytes > self._limits.max_header_bytes:
            self._stop(self._too_large_message())

    def _too_large_message(self) -> str:
        return (
            f"The request line and headers are larger than {self._limits.max_header_bytes} "
            "bytes, this server's limit (--max-header-bytes)."
        )

    def _stop(self, message: str) -> None:
        """Refuse with 431 from inside a parser callback (the parser stops at the raise)."""
        self._refused = _refusal(431, message, "RequestHeaderFieldsTooLargeError")
        raise _Refused(message)

    def _refuse_headers_too_large(self) -> None:
        self._refuse(431, self._too_large_message(), "RequestHeaderFieldsTooLargeError")

    def _refuse(self, status: int, message: str, error_type: str) -> None:
        self._refused = _refusal(status, message, error_type)
        self._send_refusal()

    def _send_refusal(self) -> None:
        self._cancel_header_timer()
        if self._refused is None or self.transport.is_closing():
            return
        self._flush_held()
        self.transport.write(self._refused)
        self._linger()

    def _body_unfinished(self) -> bool:
        """The current request's body has not all arrived (the answer went out before it)."""
        cycle = self.cycle
        return cycle is not None and cycle.more_body and not cycle.disconnected

    def _linger(self) -> None:
        """Close once what was written is sent, dropping what the client still sends meanwhile
        (at most ``_LINGER_BYTES`` for ``_LINGER_SECONDS``)."""
        if self._lingering or self.transport.is_closing():
            return
        self._lingering = True
        self._cancel_header_timer()
        self._flush_held()
        if not self.transport.can_write_eof():
            self.transport.close()
            return
        self.transport.write_eof()
        self.flow.resume_reading()
        self.loop.call_later(_LINGER_SECONDS, self.transport.close)

    def _flush_held(self) -> None:
        """Write what the current answer holds back, before this protocol writes itself."""
        if self._cycle_transport is not None:
            self._cycle_transport.flush()

    def _arm_header_timer(self) -> None:
        global _header_deadlines
        timeout = self._limits.header_timeout
        if timeout > 0:
            _header_deadlines = self._deadlines = Deadlines.of(_header_deadlines, timeout)
            self._header_timer = self._deadlines.start(self._header_timed_out)

    def _cancel_header_timer(self) -> None:
        if self._header_timer is not None and self._deadlines is not None:
            self._deadlines.stop(self._header_timer)
            self._header_timer = None

    def _header_timed_out(self) -> None:
        self._header_timer = None
        if not self._awaiting_headers or self.transport.is_closing():
            return
        if self._raw_header_bytes == 0 and self.cycle is not None:
            # A kept-alive connection between requests: uvicorn's keep-alive timeout owns it.
            return
        self._refuse(
            408,
            f"The request headers did not arrive within {self._limits.header_timeout} s, this "
            "server's limit (--header-timeout).",
            "RequestTimeoutError",
        )


class _RefusalAwareLogger:
    """uvicorn's error logger without its parser-error warning for a request this protocol
    refused: the refusal is the answer, and a warning per refused request is log volume any
    client can drive."""

    def __init__(self, logger: logging.Logger, protocol: LimitedHttpToolsProtocol) -> None:
        self._logger = logger
        self._protocol = protocol

    def warning(self, msg: object, *args: Any, **kwargs: Any) -> None:
        if self._protocol._refused is None:
            self._logger.warning(msg, *args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._logger, name)


class _CycleTransport:
    """The connection's transport as a request cycle sees it.

    Closing it while the request's body is still arriving lingers
    (``LimitedHttpToolsProtocol._linger``) instead of resetting the connection under the
    client's answer. A response's head (uvicorn writes it on ``http.response.start``, one send
    before the body) is held and goes out with the body's first write: one system call and one
    TCP segment per small answer instead of two, which on loopback is a third of a streamed
    derender chunk's server CPU. A head whose body does not follow in the same step of the
    event loop (a streamed answer) is written at the loop's next turn.
    """

    def __init__(self, transport: asyncio.Transport, protocol: LimitedHttpToolsProtocol) -> None:
        self._transport = transport
        self._protocol = protocol
        self._held = b""
        protocol._cycle_transport = self

    def write(self, data: bytes) -> None:
        held = self._held
        if held:
            self._held = b""
            if len(data) <= _JOIN_BYTES:
                self._transport.write(held + data)
            else:  # no copy of a large body
                self._transport.writelines((held, data))
        elif len(data) <= _HOLD_BYTES and data and not self._transport.is_closing():
            self._held = data
            self._protocol.loop.call_soon(self.flush)
        else:
            self._transport.write(data)

    def flush(self) -> None:
        """Write a held head now (before anything else reaches the socket)."""
        held = self._held
        if held:
            self._held = b""
            if not self._transport.is_closing():
                self._transport.write(held)

    def get_write_buffer_size(self) -> int:
        return self._transport.get_write_buffer_size() + len(self._held)

    def close(self) -> None:
        self.flush()
        if self._protocol._body_unfinished():
            self._protocol._linger()
        else:
            self._transport.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)
