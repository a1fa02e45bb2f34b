"""The hot POST routes answered from the connection's protocol, without an ASGI cycle.

A streamed derender chunk or a small chat render is a request of a few hundred microseconds of
server CPU, and the ASGI stack around its handler (Starlette and its error middleware, the
metrics middleware's wrapped receive and send, the router bypass, a response object driven
through two ASGI messages into uvicorn's ``send`` with its header checks, the head held for its
body) is a sizable part of it. For the plain case, ``http.connections.LimitedHttpToolsProtocol``
has uvicorn's task run ``Direct.serve`` instead of the app: the same guarded handler (API key,
request timeout, every error answered in vLLM's shape) reading the body through uvicorn's
``receive``, the request recorded by the same ``RequestMetrics`` (counters, latency, in-flight,
access log, ``X-Request-Id``), and one answer for the protocol to write. What the plain case is
is the protocol's decision (``_direct_route``); everything else goes the ASGI way.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping

from starlette.requests import Request
from starlette.types import Message, Receive, Scope

from render_service.http.errors import Handler
from render_service.http.metrics import RequestMetrics, request_id_of

__all__ = ["Answer", "Direct"]

#: Writes one answer: status, headers (the response's, then ``X-Request-Id``) and body.
Answer = Callable[[int, list[tuple[bytes, bytes]], bytes | memoryview], Awaitable[None]]


class _Counting:
    """uvicorn's ``receive``, counting the body bytes the handler reads (as MetricsMiddleware
    does)."""

    __slots__ = ("bytes_in", "receive")

    def __init__(self, receive: Receive) -> None:
        self.receive = receive
        self.bytes_in = 0

    async def __call__(self) -> Message:
        message = await self.receive()
        self.bytes_in += len(message.get("body", b""))
        return message


class Direct:
    """The direct routes of one app (path -> guarded handler) and its request metrics."""

    def __init__(self, routes: Mapping[str, Handler], requests: RequestMetrics) -> None:
        self.routes = {path.encode("ascii"): handler for path, handler in routes.items()}
        self.requests = requests

    async def serve(self, handler: Handler, scope: Scope, receive: Receive, answer: Answer) -> None:
        """Run ``handler`` on a request; ``answer`` writes the response. Only bodied responses
        (``Response.body``) come out of a direct route's handler (no images, no streamed parts:
        http.app registers the routes)."""
        request_id = request_id_of(scope)
        counting = _Counting(receive)
        status = 500
        bytes_out = 0
        start = self.requests.begin()
        try:
            response = await handler(Request(scope, counting))
            status = response.status_code
            content = response.body
            bytes_out = len(content)
            headers = [*response.raw_headers, (b"x-request-id", request_id.encode("latin-1"))]
            await answer(status, headers, content)
        finally:
            self.requests.end(scope, start, request_id, status, counting.bytes_in, bytes_out)
