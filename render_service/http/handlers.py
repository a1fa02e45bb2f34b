"""Request handlers: each decodes its body, calls one library function, encodes the answer."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from typing import Any, TypeVar

import msgspec
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response

from render_service import __version__
from render_service.abandon import run_abandonable
from render_service.apis import messages as messages_api
from render_service.apis import responses as responses_api
from render_service.caches import CacheSize
from render_service.derender import Derenderer
from render_service.errors import BodyTooLarge, SchemaError
from render_service.http import lifecycle, metrics
from render_service.http.auth import ApiKey
from render_service.http.errors import Handler, guarded
from render_service.http.limits import Limits
from render_service.http.openapi import openapi_document
from render_service.http.responses import (
    MsgpackResponse,
    MsgspecResponse,
    PartsResponse,
    encode_parts,
)
from render_service.protocol.chat import ChatCompletionRequest
from render_service.protocol.completions import CompletionRequest
from render_service.protocol.derender import (
    DerenderChatRequest,
    DerenderChatStreamsRequest,
    DerenderChatStreamWire,
    DerenderCompletionRequest,
    DerenderCompletionStreamRequest,
    DerenderMessagesRequest,
    DerenderMessagesStreamRequest,
    DerenderResponsesRequest,
    DerenderResponsesStreamRequest,
)
from render_service.protocol.generate import GenerateRequest
from render_service.protocol.messages import AnthropicMessagesRequest
from render_service.protocol.responses import ResponsesRequest
from render_service.protocol.server import ModelCard, ModelList, VersionResponse
from render_service.protocol.tokenize import (
    DetokenizeRequest,
    TokenizeChatRequest,
    TokenizeCompletionRequest,
)
from render_service.render import Renderer
from render_service.validation import decode_body

T = TypeVar("T")
JSON = "application/json"
MSGPACK = "application/msgpack"
# A streaming call this small that continues a state (or starts from a seed) runs on the event
# loop: the hand-off to a worker thread and back costs more than its work (~30 us).
_INLINE_IDS = 64
_SEED_HEADER = "x-derender-seed"
# A chat render of a body this small (about 6,000 prompt tokens) with the model's own template and
# no images runs on the event loop: handing it to the worker thread costs more CPU than it saves,
# and the two threads then take turns on the GIL at every system call (a 20-turn conversation's
# next turn, 25 KB: 1.9 -> 1.4 ms, server CPU 0.83x). Its work: ~1 ms with its earlier turns
# cached, ~3-4 ms new, ~10 ms at worst (32 KB of text that tokenizes slowest, one long word).
_INLINE_RENDER_BYTES = 32768
_CACHE_GAUGE_INTERVAL_S = 1.0

_chat_decoder = msgspec.json.Decoder(ChatCompletionRequest)
_completion_decoder = msgspec.json.Decoder(CompletionRequest)
_tokenize_chat_decoder = msgspec.json.Decoder(TokenizeChatRequest)
_tokenize_prompt_decoder = msgspec.json.Decoder(TokenizeCompletionRequest)
_detokenize_decoder = msgspec.json.Decoder(DetokenizeRequest)
_derender_chat_decoder = msgspec.json.Decoder(DerenderChatRequest)
_derender_chat_stream_decoder = msgspec.json.Decoder(DerenderChatStreamWire)
_chat_streams_decoders: dict[
    str,
    msgspec.json.Decoder[DerenderChatStreamsRequest]
    | msgspec.msgpack.Decoder[DerenderChatStreamsRequest],
] = {
    JSON: msgspec.json.Decoder(DerenderChatStreamsRequest),
    MSGPACK: msgspec.msgpack.Decoder(DerenderChatStreamsRequest),
}
_derender_cmpl_decoder = msgspec.json.Decoder(DerenderCompletionRequest)
_derender_cmpl_stream_decoder = msgspec.json.Decoder(DerenderCompletionStreamRequest)
_messages_decoder = msgspec.json.Decoder(AnthropicMessagesRequest)
_responses_decoder = msgspec.json.Decoder(ResponsesRequest)
_derender_messages_decoder = msgspec.json.Decoder(DerenderMessagesRequest)
_derender_messages_stream_decoder = msgspec.json.Decoder(DerenderMessagesStreamRequest)
_derender_responses_decoder = msgspec.json.Decoder(DerenderResponsesRequest)
_derender_responses_stream_decoder = msgspec.json.Decoder(DerenderResponsesStreamRequest)
_any_decoder: msgspec.json.Decoder[Any] = msgspec.json.Decoder()


def _decode_derender(
    data: bytes, batch: msgspec.json.Decoder[Any], stream: msgspec.json.Decoder[Any]
) -> Any:
    """A derender body, batch or streaming by its ``stream`` flag, decoded once when it streams
    (the hot path); a body the streaming type refuses is told apart by its flag."""
    try:
        return stream.decode(data)
    except msgspec.DecodeError:
        pass
    if decode_body(data, _stream_flag_decoder).stream is True:
        return decode_body(data, stream)  # the streaming body's own error
    return decode_body(data, batch)


def _small(body: DerenderChatStreamWire) -> bool:
    """A streaming call whose work is too small to hand to a worker thread: it continues a
    signed state (or starts from a seed) with a few ids, so it never reads a prompt."""
    state = body.stream_state
    if not isinstance(state, str) and not (state is None and body.derender_seed is not None):
        return False
    chunks = body.generate_chunks or ([body.generate_chunk] if body.generate_chunk else [])
    ids = 0
    for chunk in chunks:
        for choice in chunk.choices:
            ids += len(choice.token_ids or ())
    return ids <= _INLINE_IDS


def _own_template(body: ChatCompletionRequest) -> bool:
    """The chat renders with the model's template (a request's own runs in a child process)."""
    return body.chat_template is None and "chat_template" not in (body.chat_template_kwargs or {})


class _StreamFlag(msgspec.Struct):
    """Just the ``stream`` field, to pick the batch or streaming derender body type."""

    stream: Any = False


_stream_flag_decoder = msgspec.json.Decoder(_StreamFlag)
_OPENAPI = msgspec.json.encode(openapi_document())
_VERSION = VersionResponse(version=__version__)


class Service:
    """Request handlers bound to one Renderer, one Derenderer and one worker pool."""

    def __init__(self, renderer: Renderer, derenderer: Derenderer) -> None:
        self.renderer = renderer
        self.derenderer = derenderer
        self.settings = renderer.settings
        self.created = int(time.time())  # /v1/models reports when this server started
        self.max_body_bytes = self.settings.max_body_bytes
        self.pool = ThreadPoolExecutor(
            max_workers=max(1, self.settings.renderer_num_workers), thread_name_prefix="render"
        )
        self.limits = Limits.from_settings(self.settings)
        key = self.settings.api_key
        self.api_key = ApiKey(key) if key else None
        #: Seconds between cache-gauge refreshes after streaming derender calls.
        self.cache_gauge_interval = _CACHE_GAUGE_INTERVAL_S
        self._cache_gauges_due = 0.0

    def close(self) -> None:
        """Stop the worker pool and everything the renderer started."""
        self.pool.shutdown(wait=False, cancel_futures=True)
        self.renderer.close()

    async def run(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """The one place CPU work leaves the event loop; cancelling the wait (the request's
        timeout, or its client gone) tells the work it was abandoned (render_service.abandon)."""
        loop = asyncio.get_running_loop()
        abandoned = threading.Event()
        work = partial(run_abandonable, abandoned, partial(fn, *args, **kwargs))
        try:
            return await loop.run_in_executor(self.pool, metrics.in_pool(work))
        except asyncio.CancelledError:
            abandoned.set()
            raise

    async def body(self, request: Request, formats: tuple[str, ...] = (JSON,)) -> bytes:
        """The whole body, within --max-body-bytes, of one of ``formats`` (content types)."""
        return (await self.typed_body(request, formats))[0]

    async def typed_body(
        self, request: Request, formats: tuple[str, ...] = (JSON,)
    ) -> tuple[bytes, str]:
        """The whole body and its content type (one of ``formats``), within --max-body-bytes.

        Reads the ASGI messages itself (one pass over the headers, no stream wrapper): this
        runs once per streamed chunk."""
        content_type, declared = "", b""
        for name, value in request.scope["headers"]:
            if name == b"content-type":
                content_type = value.decode("latin-1").split(";")[0].strip().lower()
            elif name == b"content-length":
                declared = value
        too_large = declared.isdigit() and int(declared) > self.max_body_bytes
        if content_type not in formats:
            if not too_large:
                # An answer sent before the whole body has arrived closes the connection
                # (http.connections); read it first, so the client's next request finds it open.
                with contextlib.suppress(BodyTooLarge):
                    await self._read_body(request)
            allowed = " or ".join(f"'{f}'" for f in formats)
            raise SchemaError(
                f"1 validation error:\n  Unsupported Media Type: Only {allowed} is allowed"
            )
        # The 413 goes out at once; the rest of the body is then dropped unread while the
        # connection closes (a lingering close, http.connections), so the client can read it.
        if too_large:
            raise self._too_large()
        data = await self._read_body(request)
        if content_type == JSON and not data.isascii():
            data.decode("utf-8")  # vLLM answers invalid UTF-8 with its own 400 body
        return data, content_type

    async def _read_body(self, request: Request) -> bytes:
        """The body's ASGI messages joined, within --max-body-bytes."""
        chunks = []
        size = 0
        receive = request.receive
        while True:
            message = await receive()
            if message["type"] != "http.request":
                raise ClientDisconnect()
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_body_bytes:
                raise self._too_large()
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        return chunks[0] if len(chunks) == 1 else b"".join(chunks)

    def _too_large(self) -> BodyTooLarge:
        return BodyTooLarge(
            f"Request body exceeds the limit of {self.max_body_bytes} bytes (--max-body-bytes)."
        )

    def caches(self) -> list[CacheSize]:
        """Every per-process cache's size (for /metrics)."""
        stats = self.derenderer.cache.stats()
        return [
            *self.renderer.caches(),
            CacheSize(name="stream_states", entries=stats.size, bytes=stats.bytes),
            self.derenderer.streams.constants.size(),
            self.derenderer.machine.texts.cache.size(),
        ]

    def _observe_caches_now_and_then(self) -> None:
        """The cache gauges after a streaming derender call, at most once per interval: a
        chunk is too small a request to pay a refresh (~5 µs) every time."""
        now = time.monotonic()
        if now >= self._cache_gauges_due:
            self._cache_gauges_due = now + self.cache_gauge_interval
            metrics.observe_caches(self.caches())

    def guarded(self, handler: Handler) -> Handler:
        """``handler`` behind this server's API key and request timeout (http.errors.guarded)."""
        return guarded(handler, timeout=self.settings.request_timeout, api_key=self.api_key)

    # ---- endpoints ------------------------------------------------------------------------

    async def render_chat(self, request: Request) -> Response:
        data = await self.body(request)
        body = decode_body(data, _chat_decoder)
        self.limits.check_request(body)
        # Images are fetched here and processed in the media pool, never in the render pool.
        multimodal = self.renderer.multimodal
        media = await multimodal.prepare(body, stream=True) if multimodal is not None else None
        seed = request.headers.get(_SEED_HEADER, "").strip().lower() in ("1", "true")
        request_id = request.headers.get("x-request-id")
        if len(data) <= _INLINE_RENDER_BYTES and multimodal is None and _own_template(body):
            result = self._render_chat(body, request_id, None, seed)
        else:
            result = await self.run(self._render_chat, body, request_id, media, seed)
        metrics.observe_render((result,))
        metrics.observe_caches(self.caches())
        if media is None:
            return MsgspecResponse(result)
        if media.payloads is not None:
            return PartsResponse(encode_parts(result, media.payloads))
        encoded = [i.kwargs_data_base64 for i in media.items if i.kwargs_data_base64 is not None]
        if len(encoded) < len(media.items):  # mm_payload "none": no tensors to send
            return MsgspecResponse(result)
        return PartsResponse(encode_parts(result, encoded))

    def _render_chat(
        self,
        body: ChatCompletionRequest,
        request_id: str | None,
        media: Any,
        seed: bool,
    ) -> GenerateRequest:
        """Render, and with ``seed`` add the derender seed of the rendered prompt."""
        result = self.renderer.render_chat(body, request_id=request_id, media=media)
        if not seed:
            return result
        token = self.derenderer.derender_seed(body, result.token_ids)
        return msgspec.structs.replace(result, derender_seed=token)

    async def render_completion(self, request: Request) -> Response:
        data = await self.body(request)
        body = decode_body(data, _completion_decoder)
        self.limits.check_request(body)
        result = await self.run(
            self.renderer.render_completion, body, request_id=request.headers.get("x-request-id")
        )
        metrics.observe_render(result)
        metrics.observe_caches(self.caches())
        return MsgspecResponse(result)

    async def render_messages(self, request: Request) -> Response:
        data = await self.body(request)
        body = decode_body(data, _messages_decoder, messages_api.request_param)
        self.limits.check_request(body)
        result = await self.run(
            self.renderer.render_messages, body, request_id=request.headers.get("x-request-id")
        )
        metrics.observe_render((result,))
        metrics.observe_caches(self.caches())
        return MsgspecResponse(result)

    async def render_responses(self, request: Request) -> Response:
        data = await self.body(request)
        body = decode_body(data, _responses_decoder, responses_api.request_param)
        self.limits.check_request(body)
        result = await self.run(self.renderer.render_responses, body)
        metrics.observe_render((result,))
        metrics.observe_caches(self.caches())
        return MsgspecResponse(result)

    async def derender_messages(self, request: Request) -> Response:
        return await self._derender(
            request,
            (_derender_messages_decoder, self.derenderer.derender_messages),
            (_derender_messages_stream_decoder, self.derenderer.derender_messages_stream),
        )

    async def derender_responses(self, request: Request) -> Response:
        return await self._derender(
            request,
            (_derender_responses_decoder, self.derenderer.derender_responses),
            (_derender_responses_stream_decoder, self.derenderer.derender_responses_stream),
        )

    async def derender_chat(self, request: Request) -> Response:
        data = await self.body(request)
        body = _decode_derender(data, _derender_chat_decoder, _derender_chat_stream_decoder)
        self.limits.check_request(body)
        if isinstance(body, DerenderChatStreamWire):
            work = partial(self.derenderer.derender_chat_stream, body, self.limits.check_embedded)
            result: Any = work() if _small(body) else await self.run(work)
        else:
            result = await self.run(self.derenderer.derender_chat, body)
        metrics.observe_derender(body, self.derenderer.cache)
        self._observe_caches_now_and_then()
        return MsgspecResponse(result)

    async def derender_chat_streams(self, request: Request) -> Response:
        """Ours: one engine step's chunks of many chat streams, JSON or msgpack."""
        data, content_type = await self.typed_body(request, (JSON, MSGPACK))
        body = decode_body(data, _chat_streams_decoders[content_type])
        self.limits.check_request(body)
        result = await self.run(
            self.derenderer.derender_chat_streams,
            body,
            self.limits.check_embedded,
            msgpack=content_type == MSGPACK,
        )
        metrics.observe_derender(body, self.derenderer.cache)
        self._observe_caches_now_and_then()
        if MSGPACK in request.headers.get("accept", ""):
            return MsgpackResponse(result)
        return MsgspecResponse(result)

    async def derender_completion(self, request: Request) -> Response:
        return await self._derender(
            request,
            (_derender_cmpl_decoder, self.derenderer.derender_completion),
            (_derender_cmpl_stream_decoder, self.derenderer.derender_completion_stream),
        )

    async def _derender(
        self,
        request: Request,
        batch: tuple[msgspec.json.Decoder[Any], Callable[[Any], Any]],
        stream: tuple[msgspec.json.Decoder[Any], Callable[[Any], Any]],
    ) -> Response:
        """Batch or streaming derender, picked by the body's ``stream`` flag."""
        data = await self.body(request)
        decoder, derender = (
            stream if decode_body(data, _stream_flag_decoder).stream is True else batch
        )
        body = decode_body(data, decoder)
        self.limits.check_request(body)
        result = await self.run(derender, body)
        metrics.observe_derender(body, self.derenderer.cache)
        metrics.observe_caches(self.caches())
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
        card = ModelCard(
            id=info.served_model_name,
            created=self.created,
            root=self.settings.model,
            max_model_len=info.max_model_len,
        )
        return MsgspecResponse(ModelList(data=[card]))

    async def health(self, request: Request) -> Response:
        return Response(status_code=200)

    async def ready(self, request: Request) -> Response:
        """Readiness, unlike /health (liveness): 503 once a graceful shutdown has begun."""
        return Response(status_code=503 if lifecycle.draining() else 200)

    async def version(self, request: Request) -> Response:
        return MsgspecResponse(_VERSION)

    async def openapi(self, request: Request) -> Response:
        return Response(_OPENAPI, media_type="application/json")
