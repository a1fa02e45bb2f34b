"""The HTTP layer: a Starlette app whose handlers decode, call one library function, encode."""

from __future__ import annotations

import asyncio
import hashlib
import logging
import secrets
import time
from collections.abc import Awaitable, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from typing import Any, TypeVar

import msgspec
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from render_service import __version__, json_parts, lifecycle, metrics
from render_service.derender import Derenderer, build_derenderer
from render_service.errors import (
    BodyTooLarge,
    LimitExceeded,
    RenderServiceError,
    RequestTimeout,
    SchemaError,
)
from render_service.limits import Limits
from render_service.openapi import openapi_document
from render_service.protocol._base import decode_body
from render_service.protocol.chat import ChatCompletionRequest
from render_service.protocol.completions import CompletionRequest
from render_service.protocol.derender import (
    DerenderChatRequest,
    DerenderChatStreamRequest,
    DerenderCompletionRequest,
    DerenderCompletionStreamRequest,
)
from render_service.protocol.tokenize import (
    DetokenizeRequest,
    TokenizeChatRequest,
    TokenizeCompletionRequest,
)
from render_service.render import Renderer

log = logging.getLogger("render_service")
T = TypeVar("T")

_encoder = msgspec.json.Encoder()
_chat_decoder = msgspec.json.Decoder(ChatCompletionRequest)
_completion_decoder = msgspec.json.Decoder(CompletionRequest)
_tokenize_chat_decoder = msgspec.json.Decoder(TokenizeChatRequest)
_tokenize_prompt_decoder = msgspec.json.Decoder(TokenizeCompletionRequest)
_detokenize_decoder = msgspec.json.Decoder(DetokenizeRequest)
_derender_chat_decoder = msgspec.json.Decoder(DerenderChatRequest)
_derender_chat_stream_decoder = msgspec.json.Decoder(DerenderChatStreamRequest)
_derender_cmpl_decoder = msgspec.json.Decoder(DerenderCompletionRequest)
_derender_cmpl_stream_decoder = msgspec.json.Decoder(DerenderCompletionStreamRequest)


class _StreamFlag(msgspec.Struct):
    """Just the ``stream`` field, to pick the batch or streaming derender body type."""

    stream: Any = False


_stream_flag_decoder = msgspec.json.Decoder(_StreamFlag)
_GUARDED_PREFIXES = ("/v1", "/v2", "/inference")
DEFAULT_MAX_BODY_BYTES = 64 * 1024 * 1024


class MsgspecResponse(Response):
    media_type = "application/json"

    def render(self, content: Any) -> bytes:
        return _encoder.encode(content)


class PartsResponse(Response):
    """A JSON body cut into pieces (``json_parts``), sent one after another; payloads that
    are still being made are sent piece by piece as they come."""

    media_type = "application/json"

    def __init__(self, parts: Sequence[bytes | json_parts.Streamed]) -> None:
        self.parts = parts
        size = sum(len(p) if isinstance(p, bytes) else p.size for p in parts)
        super().__init__(headers={"content-length": str(size)})

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await send(
            {"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers}
        )
        last = len(self.parts) - 1
        for i, part in enumerate(self.parts):
            if isinstance(part, bytes):
                await send({"type": "http.response.body", "body": part, "more_body": i < last})
                continue
            async for piece in part.pieces():
                await send({"type": "http.response.body", "body": piece, "more_body": True})
            if i == last:
                await send({"type": "http.response.body", "body": b"", "more_body": False})


def error_response(exc: RenderServiceError) -> Response:
    body = {
        "error": {
            "message": exc.message,
            "type": exc.error_type,
            "param": exc.param,
            "code": exc.status,
        }
    }
    return MsgspecResponse(body, status_code=exc.status)


class Service:
    """Request handlers bound to one Renderer and one worker pool."""

    def __init__(
        self,
        renderer: Renderer,
        derenderer: Derenderer,
        *,
        max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    ) -> None:
        self.renderer = renderer
        self.derenderer = derenderer
        self.settings = renderer.settings
        self.created = int(time.time())  # /v1/models reports when this server started
        self.max_body_bytes = max_body_bytes
        self.pool = ThreadPoolExecutor(
            max_workers=max(1, self.settings.renderer_num_workers), thread_name_prefix="render"
        )
        self.limits = Limits.from_settings(self.settings)
        key = self.settings.api_key
        self._api_key_digest = hashlib.sha256(key.encode()).digest() if key else None

    async def run(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """The one place CPU work leaves the event loop."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self.pool, metrics.in_pool(partial(fn, *args, **kwargs)))

    async def body(self, request: Request) -> bytes:
        content_type = request.headers.get("content-type", "").split(";")[0].strip().lower()
        if content_type != "application/json":
            raise SchemaError(
                "1 validation error:\n  Unsupported Media Type: Only 'application/json' is allowed"
            )
        declared = request.headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_body_bytes:
            raise BodyTooLarge(
                f"Request body exceeds the limit of {self.max_body_bytes} bytes (--max-body-bytes)."
            )
        chunks = []
        size = 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > self.max_body_bytes:
                raise BodyTooLarge(
                    f"Request body exceeds the limit of {self.max_body_bytes} bytes (--max-body-bytes)."
                )
            chunks.append(chunk)
        data = b"".join(chunks)
        data.decode("utf-8")  # vLLM answers invalid UTF-8 with its own 400 body
        return data

    # ---- endpoints ------------------------------------------------------------------------

    async def render_chat(self, request: Request) -> Response:
        data = await self.body(request)
        body = decode_body(data, _chat_decoder)
        self.limits.check_request(body)
        # Images are fetched here and processed in the media pool, never in the render pool.
        multimodal = self.renderer.multimodal
        media = await multimodal.prepare(body, stream=True) if multimodal is not None else None
        result = await self.run(
            self.renderer.render_chat,
            body,
            request_id=request.headers.get("x-request-id"),
            media=media,
        )
        metrics.observe_render((result,))
        if media is None:
            return MsgspecResponse(result)
        if media.payloads is not None:
            return PartsResponse(json_parts.encode_parts(result, media.payloads))
        encoded = [i.kwargs_data_base64 for i in media.items if i.kwargs_data_base64 is not None]
        if len(encoded) < len(media.items):  # mm_payload "none": no tensors to send
            return MsgspecResponse(result)
        return PartsResponse(json_parts.encode_parts(result, encoded))

    async def render_completion(self, request: Request) -> Response:
        data = await self.body(request)
        body = decode_body(data, _completion_decoder)
        self.limits.check_request(body)
        result = await self.run(
            self.renderer.render_completion, body, request_id=request.headers.get("x-request-id")
        )
        metrics.observe_render(result)
        return MsgspecResponse(result)

    async def derender_chat(self, request: Request) -> Response:
        data = await self.body(request)
        if decode_body(data, _stream_flag_decoder).stream is True:
            stream_body = decode_body(data, _derender_chat_stream_decoder)
            self.limits.check_request(stream_body)
            return self.derendered(
                stream_body, await self.run(self.derenderer.derender_chat_stream, stream_body)
            )
        body = decode_body(data, _derender_chat_decoder)
        self.limits.check_request(body)
        return self.derendered(body, await self.run(self.derenderer.derender_chat, body))

    async def derender_completion(self, request: Request) -> Response:
        data = await self.body(request)
        if decode_body(data, _stream_flag_decoder).stream is True:
            stream_body = decode_body(data, _derender_cmpl_stream_decoder)
            self.limits.check_request(stream_body)
            return self.derendered(
                stream_body, await self.run(self.derenderer.derender_completion_stream, stream_body)
            )
        body = decode_body(data, _derender_cmpl_decoder)
        self.limits.check_request(body)
        return self.derendered(body, await self.run(self.derenderer.derender_completion, body))

    def derendered(self, body: Any, result: Any) -> Response:
        metrics.observe_derender(body, self.derenderer.cache)
        return MsgspecResponse(result)

    async def tokenize(self, request: Request) -> Response:
        data = await self.body(request)
        raw = decode_body(data, _any_decoder)
        body: TokenizeChatRequest | TokenizeCompletionRequest
        if isinstance(raw, dict) and "messages" in raw:
            body = decode_body(data, _tokenize_chat_decoder)
        else:
            body = decode_body(data, _tokenize_prompt_decoder)
        self.limits.check_request(body)
        multimodal = self.renderer.multimodal
        media = None
        if multimodal is not None and isinstance(body, TokenizeChatRequest):
            media = await multimodal.prepare(body)  # in the media pool, as for render
        return MsgspecResponse(await self.run(self.renderer.tokenize, body, media))

    async def detokenize(self, request: Request) -> Response:
        data = await self.body(request)
        body = decode_body(data, _detokenize_decoder)
        return MsgspecResponse(await self.run(self.renderer.detokenize, body))

    async def models(self, request: Request) -> Response:
        info = self.renderer.model.info
        card = {
            "id": info.served_model_name,
            "object": "model",
            "created": self.created,
            "owned_by": "vllm",
            "root": self.settings.model,
            "parent": None,
            "max_model_len": info.max_model_len,
            "permission": [],
        }
        return MsgspecResponse({"object": "list", "data": [card]})

    async def health(self, request: Request) -> Response:
        return Response(status_code=200)

    async def ready(self, request: Request) -> Response:
        """Readiness, unlike /health (liveness): 503 once a graceful shutdown has begun."""
        return Response(status_code=503 if lifecycle.draining() else 200)

    async def version(self, request: Request) -> Response:
        return MsgspecResponse({"version": __version__})

    async def openapi(self, request: Request) -> Response:
        return Response(_OPENAPI, media_type="application/json")

    # ---- middleware-ish wrappers ----------------------------------------------------------

    def guarded(
        self, handler: Callable[[Request], Awaitable[Response]]
    ) -> Callable[[Request], Awaitable[Response]]:
        timeout = self.settings.request_timeout

        async def endpoint(request: Request) -> Response:
            try:
                if self._api_key_digest is not None and request.url.path.startswith(
                    _GUARDED_PREFIXES
                ):
                    self._check_auth(request)
                if not timeout:
                    return await handler(request)
                # Cancelling the wait also cancels a render still queued for a worker thread; one
                # already running finishes its (limit-bounded) work, with no one waiting for it.
                return await asyncio.wait_for(handler(request), timeout)
            except TimeoutError:
                return error_response(
                    RequestTimeout(
                        f"The request took longer than this server's limit of {timeout} s "
                        "(--request-timeout)."
                    )
                )
            except _Unauthorized:
                return JSONResponse({"error": "Unauthorized"}, status_code=401)
            except UnicodeDecodeError:
                return JSONResponse(
                    {"detail": "There was an error parsing the body"}, status_code=400
                )
            except RenderServiceError as exc:
                return error_response(exc)
            except RecursionError:  # nesting deep enough to exhaust Python's stack somewhere
                return error_response(
                    LimitExceeded("The request nests JSON too deeply (--max-json-depth).")
                )
            except Exception:
                log.exception("unhandled error on %s", request.url.path)
                body = {
                    "error": {
                        "message": "Internal server error",
                        "type": "InternalServerError",
                        "param": None,
                        "code": 500,
                    }
                }
                return MsgspecResponse(body, status_code=500)

        return endpoint

    def _check_auth(self, request: Request) -> None:
        header = request.headers.get("authorization", "")
        scheme, _, token = header.partition(" ")
        if scheme.lower() != "bearer" or self._api_key_digest is None:
            raise _Unauthorized
        if not secrets.compare_digest(
            hashlib.sha256(token.encode()).digest(), self._api_key_digest
        ):
            raise _Unauthorized


class _Unauthorized(Exception):
    pass


_any_decoder: msgspec.json.Decoder[Any] = msgspec.json.Decoder()
_OPENAPI = msgspec.json.encode(openapi_document())


def build_app(renderer: Renderer) -> Starlette:
    """The Starlette application for one model."""
    service = Service(
        renderer, build_derenderer(renderer), max_body_bytes=renderer.settings.max_body_bytes
    )
    g = service.guarded
    routes = [
        Route("/v1/chat/completions/render", g(service.render_chat), methods=["POST"]),
        Route("/v1/completions/render", g(service.render_completion), methods=["POST"]),
        Route("/v1/chat/completions/derender", g(service.derender_chat), methods=["POST"]),
        Route("/v1/completions/derender", g(service.derender_completion), methods=["POST"]),
        Route("/tokenize", g(service.tokenize), methods=["POST"]),
        Route("/detokenize", g(service.detokenize), methods=["POST"]),
        Route("/v1/models", g(service.models), methods=["GET"]),
        Route("/health", service.health, methods=["GET"]),
        Route("/version", service.version, methods=["GET"]),
        Route("/ready", service.ready, methods=["GET"]),
        Route("/metrics", metrics.metrics_endpoint, methods=["GET"]),
        Route("/openapi.json", service.openapi, methods=["GET"]),
    ]
    metrics.pool_size(max(1, renderer.settings.renderer_num_workers))
    app = Starlette(
        routes=routes,
        middleware=[Middleware(metrics.MetricsMiddleware, endpoints=[r.path for r in routes])],
    )
    app.state.service = service
    return app
