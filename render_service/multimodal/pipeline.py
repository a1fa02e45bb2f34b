"""Images in chat requests -> the ``features`` of vLLM 0.33's GenerateRequest.

Two stages, so that image work never holds up text renders:

1. ``MediaPipeline.prepare`` (async, before rendering): fetches every image part on the event
   loop, then decodes, preprocesses, hashes and serializes the items in the media pool (its own
   threads or processes, ``--media-num-workers``). The result is a ``MediaBatch``. The HTTP
   layer asks for it streamed: it comes back once every image is decoded, and each item's
   tensors follow as base64 pieces (``Payload``) while the response is already being sent.
2. ``MediaBatch.expand`` (inside the ordinary render, after tokenization): each
   ``<|image_pad|>`` the chat template emitted becomes as many pads as the image has tokens,
   and the ``features`` dict is assembled around the new ids.
"""

from __future__ import annotations

import asyncio
import multiprocessing
from collections.abc import AsyncIterator, Callable
from concurrent.futures import Executor, Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import Any, TypeVar

import msgspec

from render_service.caches import CacheSize
from render_service.errors import InvalidRequest, invalid_param
from render_service.multimodal import serialize, work
from render_service.multimodal.cache import patch_cache
from render_service.multimodal.fetch import (
    FetchLimits,
    MediaError,
    decode_data_url,
    fetch_http,
    read_local,
)
from render_service.multimodal.qwen2_vl import VisionConfig, patch_row_width
from render_service.multimodal.warm_pool import WarmThreadPool
from render_service.multimodal.work import MediaItem
from render_service.protocol.chat import ChatCompletionRequest
from render_service.settings import Settings
from render_service.validation import convert

T = TypeVar("T")

# The image part type this server fetches and processes (others are refused at templating).
_URL_PART = "image_url"
# What a Qwen2-VL-family chat template writes for an image (used for string-format templates).
IMAGE_PLACEHOLDER = "<|vision_start|><|image_pad|><|vision_end|>"
DEFAULT_IMAGE_LIMIT = 999  # vLLM's per-prompt default for each modality
_WHITE = (255, 255, 255)
_IO_KEYS = frozenset({"rgba_background_color"})
# Data URLs up to this size are decoded on the event loop (well under a millisecond);
# larger ones go to the media pool.
_INLINE_DATA_URL = 1 << 20


class ImagePart(msgspec.Struct, frozen=True, kw_only=True):
    """Where an image came from in the request, and what it is."""

    message: int
    part: int
    url: str | None
    uuid: str | None

    @property
    def where(self) -> str:
        return f"messages[{self.message}].content[{self.part}]"

    @property
    def param(self) -> str:
        return f"messages.{self.message}.content.{self.part}"

    def error(self, reason: str) -> MediaError:
        return MediaError(f"{self.where}: {reason}", self.param)


class Payload:
    """One item's base64, arriving in pieces from the media pool while it is being made."""

    def __init__(self, size: int, loop: asyncio.AbstractEventLoop) -> None:
        self.size = size  # bytes of base64 in all
        self._loop = loop
        self._pieces: asyncio.Queue[bytes | BaseException | None] = asyncio.Queue()

    def put(self, piece: bytes | BaseException | None) -> None:
        """From any thread: a piece, the error that ended the item, or None once it is whole."""
        self._loop.call_soon_threadsafe(self._pieces.put_nowait, piece)

    async def pieces(self) -> AsyncIterator[bytes]:
        while (piece := await self._pieces.get()) is not None:
            if isinstance(piece, BaseException):
                raise piece
            yield piece


def _decode_then_finish(job: work.Job, decoded: Future[work.Decoded], payload: Payload) -> None:
    """One image in one media thread: decoded (the request waits for that: it can still fail),
    then its payload made and sent on in pieces."""
    if not decoded.set_running_or_notify_cancel():
        return  # the request is gone (its client hung up) before the image was started
    try:
        image = work.decode(job)
    except BaseException as exc:
        decoded.set_exception(exc)
        return
    decoded.set_result(image)
    try:
        work.finish(job, image, payload.put)
    except BaseException as exc:
        payload.put(exc)
        raise
    payload.put(None)


class MediaBatch(msgspec.Struct, frozen=True, kw_only=True):
    """The processed images of one request, in prompt order."""

    items: list[MediaItem]
    image_token_id: int
    # The items' base64 still on its way (``prepare(stream=True)``); ``items`` then carry none.
    payloads: list[Payload] | None = None

    def expand(self, token_ids: list[int]) -> tuple[list[int], dict[str, Any]]:
        """Expand each image pad to its image's length; return the ids and ``features``."""
        positions = [i for i, t in enumerate(token_ids) if t == self.image_token_id]
        if len(positions) != len(self.items):
            raise InvalidRequest(
                f"The prompt has {len(positions)} image placeholders for {len(self.items)} images; "
                "the chat template dropped or added an image."
            )
        ids: list[int] = []
        placeholders = []
        start = 0
        for position, item in zip(positions, self.items, strict=True):
            ids.extend(token_ids[start:position])
            placeholders.append({"offset": len(ids), "length": item.num_tokens})
            ids.extend([self.image_token_id] * item.num_tokens)
            start = position + 1
        ids.extend(token_ids[start:])
        with_payload = self.payloads is not None or all(
            item.kwargs_data is not None for item in self.items
        )
        features = {
            "mm_hashes": {"image": [item.mm_hash for item in self.items]},
            "mm_placeholders": {"image": placeholders},
            "kwargs_data": {"image": [i.kwargs_data for i in self.items]} if with_payload else None,
            "mm_metadata": {"image": [i.mm_metadata for i in self.items]} if with_payload else None,
        }
        return ids, features


def image_parts(messages: list[dict[str, Any]]) -> list[ImagePart]:
    """Every image part of the messages, in order (the order of the prompt's placeholders)."""
    parts = []
    for m, message in enumerate(messages):
        content = message.get("content") if isinstance(message, dict) else None
        if not isinstance(content, list):
            continue
        for p, part in enumerate(content):
            if not isinstance(part, dict) or part.get("type") != _URL_PART:
                continue
            image_url = part.get("image_url")
            url = image_url.get("url") if isinstance(image_url, dict) else image_url
            uuid = part.get("uuid")
            item = ImagePart(
                message=m,
                part=p,
                url=url if isinstance(url, str) else None,
                uuid=uuid if isinstance(uuid, str) else None,
            )
            if uuid is not None and item.uuid is None:
                raise item.error("uuid must be a string")
            if item.url is None:
                raise item.error(
                    "image_url.url is required (items referenced only by uuid need a processor "
                    "cache, which a stateless render tier does not keep)"
                )
            parts.append(item)
    return parts


class MediaPipeline:
    """Image handling for one Qwen2-VL-family model: limits, pool, processor settings."""

    #: The image's stand-in in a string-format chat template's text.
    placeholder = IMAGE_PLACEHOLDER

    def __init__(self, model_id: str, vision: VisionConfig, settings: Settings) -> None:
        self.model_id = model_id
        self.vision = vision
        self.settings = settings
        self.limits = FetchLimits(
            timeout=settings.media_fetch_timeout,
            max_bytes=settings.max_media_bytes,
            max_redirects=settings.max_media_redirects,
            allow_private=settings.allow_private_media_urls,
            allowed_local_path=settings.allowed_local_media_path,
        )
        self.max_images = _image_limit(settings.limit_mm_per_prompt)
        self.pool = self._new_pool()

    def _new_pool(self) -> Executor:
        workers = self.settings.media_workers
        if self.settings.media_executor == "thread":
            threads = WarmThreadPool(workers, "media", work.init_worker)
            threads.submit(work.ready).result()  # one compile serves every thread of the process
            return threads
        # spawn: the server process has threads, which fork would copy in odd states.
        context = multiprocessing.get_context("spawn")
        pool = ProcessPoolExecutor(
            max_workers=workers, mp_context=context, initializer=work.init_worker
        )
        for _ in range(workers):  # start the workers now, not on the first image request
            pool.submit(work.ready)
        return pool

    @property
    def cache_bytes(self) -> int:
        """The processed-image cache's budget (--mm-processor-cache-gb; 0: off)."""
        return int(self.settings.mm_processor_cache_gb * (1 << 30))

    def caches(self) -> list[CacheSize]:
        """The processed-image cache's size when image work runs in this process's threads (a
        media worker process keeps its own, not seen from here)."""
        if self.cache_bytes <= 0 or not isinstance(self.pool, WarmThreadPool):
            return []
        return [patch_cache(self.cache_bytes).size()]

    def close(self) -> None:
        """Stop the media pool's workers (queued work is dropped)."""
        self.pool.shutdown(wait=False, cancel_futures=True)

    async def _in_pool(self, part: ImagePart, fn: Callable[..., T], *args: Any) -> T:
        """Run one image step in the media pool; its failures become 400s naming the part."""
        pool = self.pool
        try:
            return await asyncio.get_running_loop().run_in_executor(pool, fn, *args)
        except BrokenProcessPool as exc:
            # A worker died (a decoder crash, the OOM killer): replace the pool, keep serving.
            if self.pool is pool:
                self.pool = self._new_pool()
                pool.shutdown(wait=False, cancel_futures=True)
            raise part.error("image processing failed (the worker stopped)") from exc
        except ValueError as exc:
            raise part.error(str(exc)) from exc

    @staticmethod
    def _grid(
        part: ImagePart, data: bytes, max_pixels: int, vision: VisionConfig
    ) -> tuple[int, int, int]:
        try:
            return work.header_grid(data, max_pixels, vision)
        except ValueError as exc:
            raise part.error(str(exc)) from exc

    async def _decoded(self, part: ImagePart, future: Future[work.Decoded]) -> work.Decoded:
        try:
            return await asyncio.wrap_future(future)
        except ValueError as exc:
            raise part.error(str(exc)) from exc

    @classmethod
    def for_model(cls, model_path: str, model_id: str, settings: Settings) -> MediaPipeline | None:
        vision = VisionConfig.from_model_dir(model_path)
        if vision is None:
            return None
        server_kwargs = dict(settings.mm_processor_kwargs or {})
        return cls(model_id, vision.with_kwargs(server_kwargs), settings)

    # ---- request options ------------------------------------------------------------------

    def _request_kwargs(self, request: Any) -> tuple[dict[str, Any], dict[str, Any]]:
        """The request's processor and image-IO kwargs, after the trust gate."""
        mm_kwargs = dict(getattr(request, "mm_processor_kwargs", None) or {})
        io_kwargs = dict((getattr(request, "media_io_kwargs", None) or {}).get("image") or {})
        trusted = self.settings.trust_request_mm_kwargs
        if mm_kwargs and not trusted:
            raise _untrusted("mm_processor_kwargs")
        if getattr(request, "media_io_kwargs", None) and not trusted:
            raise _untrusted("media_io_kwargs")
        unknown = sorted(set(io_kwargs) - _IO_KEYS)
        if unknown:
            raise invalid_param(
                f"Unsupported image media_io_kwargs: {', '.join(unknown)}", "media_io_kwargs"
            )
        return mm_kwargs, io_kwargs

    def _background(self, io_kwargs: dict[str, Any]) -> tuple[int, int, int]:
        server = (self.settings.media_io_kwargs or {}).get("image") or {}
        value = io_kwargs.get("rgba_background_color", server.get("rgba_background_color", _WHITE))
        if (
            not isinstance(value, (list, tuple))
            or len(value) != 3
            or not all(isinstance(v, int) and 0 <= v <= 255 for v in value)
        ):
            raise invalid_param(
                "rgba_background_color must be three integers in 0..255", "media_io_kwargs"
            )
        return (int(value[0]), int(value[1]), int(value[2]))

    # ---- the async stage ------------------------------------------------------------------

    def has_images(self, request: Any) -> bool:
        messages = getattr(request, "messages", None) or []
        return any(
            isinstance(m, dict)
            and isinstance(m.get("content"), list)
            and any(isinstance(p, dict) and p.get("type") == _URL_PART for p in m["content"])
            for m in messages
        )

    async def prepare(self, request: Any, stream: bool = False) -> MediaBatch | None:
        """Fetch and process the request's images; None when it has none.

        With ``stream`` (and media threads), it returns once every image is decoded: nothing
        can fail after that, and the items' tensors follow in ``payloads``, base64 in pieces,
        so a response can be sent while its later rows are still being made.
        """
        request = _as_request(request)
        if not self.has_images(request):
            self._request_kwargs(request)
            return None
        mm_kwargs, io_kwargs = self._request_kwargs(request)
        parts = image_parts(request.messages)
        if len(parts) > self.max_images:
            raise invalid_param(
                f"At most {self.max_images} image(s) may be provided in one prompt.",
                "messages",
            )
        vision = self.vision.with_kwargs(mm_kwargs)
        background = self._background(io_kwargs)
        contents = await asyncio.gather(*(self._load(part) for part in parts))
        max_pixels = self.settings.max_image_pixels
        slices = grids = None
        if getattr(request, "mm_payload", "tensors") != "none":
            # Every item records the rows of all items of the request (vLLM's layout), so the
            # row counts come first, from the image headers (a header parse takes microseconds,
            # less than a trip to a worker).
            grids = [
                self._grid(part, data, max_pixels, vision)
                for part, data in zip(parts, contents, strict=True)
            ]
            slices = serialize.batch_slices([t * h * w for t, h, w in grids])
        jobs = [
            work.Job(
                data=data,
                model_id=self.model_id,
                vision=vision,
                background=background,
                mm_kwargs=mm_kwargs,
                io_kwargs=io_kwargs,
                uuid=part.uuid,
                max_pixels=max_pixels,
                slices=slices,
                cache_bytes=self.cache_bytes,
            )
            for part, data in zip(parts, contents, strict=True)
        ]
        threads = isinstance(self.pool, WarmThreadPool)
        if not (stream and threads and slices is not None and grids is not None):
            items = await asyncio.gather(
                *(self._in_pool(part, work.run, job) for part, job in zip(parts, jobs, strict=True))
            )
            return MediaBatch(items=list(items), image_token_id=self.vision.image_token_id)
        loop = asyncio.get_running_loop()
        row_width = patch_row_width(vision)
        pending, decoding = [], []
        for job, grid in zip(jobs, grids, strict=True):
            size = serialize.item_size(grid, row_width, slices)
            payload = Payload(serialize.encoded_size(size), loop)
            decoded: Future[work.Decoded] = Future()
            self.pool.submit(_decode_then_finish, job, decoded, payload)
            pending.append(payload)
            decoding.append(decoded)
        images = await asyncio.gather(
            *(self._decoded(part, d) for part, d in zip(parts, decoding, strict=True))
        )
        items = [
            MediaItem(
                mm_hash=image.mm_hash,
                num_tokens=image.num_tokens,
                kwargs_data=None,
                kwargs_data_base64=None,
                mm_metadata=serialize.metadata_item(image.grid_thw),
            )
            for image in images
        ]
        return MediaBatch(items=items, image_token_id=self.vision.image_token_id, payloads=pending)

    def prepare_blocking(self, request: Any) -> MediaBatch | None:
        """``prepare`` for callers without an event loop (library use, worker threads)."""
        request = _as_request(request)
        if not self.has_images(request):
            self._request_kwargs(request)
            return None
        return asyncio.run(self.prepare(request))

    async def _load(self, part: ImagePart) -> bytes:
        url = part.url or ""
        try:
            if url.startswith("data:"):
                if len(url) <= _INLINE_DATA_URL:
                    return decode_data_url(url)
                # Large payloads: base64 decoding stays off the event loop too.
                return await self._in_pool(part, decode_data_url, url)
            if url.startswith(("http://", "https://")):
                return await fetch_http(url, self.limits)
            if url.startswith("file:"):
                return await self._in_pool(part, read_local, url, self.limits)
        except TimeoutError as exc:
            raise part.error("fetching the image timed out") from exc
        except (ValueError, OSError) as exc:
            raise part.error(str(exc)) from exc
        raise part.error("image URLs must be data:, http(s): or file: URLs")


def _as_request(request: Any) -> Any:
    """Library callers may pass a plain dict, as ``Renderer.render_chat`` allows."""
    if isinstance(request, dict):
        return convert(request, ChatCompletionRequest, "body")
    return request


def _image_limit(limits: dict[str, Any] | None) -> int:
    """``--limit-mm-per-prompt``'s image count: ``{"image": 4}`` or ``{"image": {"count": 4}}``."""
    value = (limits or {}).get("image", DEFAULT_IMAGE_LIMIT)
    if isinstance(value, dict):
        value = value.get("count", DEFAULT_IMAGE_LIMIT)
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ValueError(f"--limit-mm-per-prompt: bad image limit {value!r}")
    return value


def _untrusted(name: str) -> InvalidRequest:
    return invalid_param(
        f"Per-request {name} are disabled by default because they can change multimodal "
        "preprocessing resource usage. Start the server with --trust-request-mm-kwargs only "
        "when clients are trusted.",
        name,
    )
