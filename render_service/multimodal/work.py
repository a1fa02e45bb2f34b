"""The CPU-heavy image steps, as plain functions of picklable values.

They run in the media pool: threads by default (Pillow's decoder, the compiled resize and the
big numpy copies release the GIL), or processes with ``--media-executor process`` (nothing can hold the server's GIL, and a
crash in an image decoder stays in the worker). Errors are ``ValueError`` with a client-facing
reason; the caller adds which message and part failed.
"""

from __future__ import annotations

import contextlib
import functools
import os
import sys
import threading
from collections.abc import Callable
from typing import Any

import msgspec
import numpy as np
import pybase64
from numpy.typing import NDArray

from render_service.errors import InvalidRequest
from render_service.multimodal import serialize
from render_service.multimodal.cache import PatchCache, Patches, patch_cache
from render_service.multimodal.decode import decode_rgb, open_header, open_lazily
from render_service.multimodal.halves import Helper
from render_service.multimodal.hashing import EncodedImage, image_hash
from render_service.multimodal.memory import keep_freed_buffers
from render_service.multimodal.qwen2_vl import (
    VisionConfig,
    patch_grid,
    patch_row_width,
    process_image,
)


class MediaItem(msgspec.Struct, frozen=True, kw_only=True):
    """One image ready for the GenerateRequest: hash, token count and serialized tensors."""

    mm_hash: str
    num_tokens: int
    kwargs_data: bytes | bytearray | None  # msgpack; JSON-encoded as base64 text
    kwargs_data_base64: bytes | None  # that text, made here rather than on the event loop
    mm_metadata: bytes | None


class Job(msgspec.Struct, frozen=True, kw_only=True):
    data: bytes
    model_id: str
    vision: VisionConfig
    background: tuple[int, int, int]
    mm_kwargs: dict[str, Any]
    io_kwargs: dict[str, Any]
    uuid: str | None
    max_pixels: int
    slices: serialize.Slices | None  # None: mm_payload "none", no tensors
    cache_bytes: int = 0  # the process's patch cache capacity; 0: no cache


# Image work runs below the server's own threads in CPU priority, so the event loop and text
# renders keep their latency while images take whatever CPU is left: Linux's idle scheduling
# class where allowed (measured here under 4-image load: text p99 16.8 ms vs 24.8 ms at nice
# 10), else nice 10.
MEDIA_NICENESS = 10


def init_worker() -> None:
    """Pool initializer: a lower CPU priority for the worker, glibc tuned for big buffers."""
    if sys.platform == "linux":  # per thread there; elsewhere it would slow the whole server
        thread = threading.get_native_id()
        os.setpriority(os.PRIO_PROCESS, thread, MEDIA_NICENESS)
        with contextlib.suppress(OSError):  # a seccomp profile may refuse it: nice 10 stays
            os.sched_setscheduler(thread, os.SCHED_IDLE, os.sched_param(0))
    keep_freed_buffers()


@functools.cache
def helper() -> Helper | None:
    """The process's spare thread for halves of an image's resize passes (None on a
    single core)."""
    return Helper(init_worker) if (os.cpu_count() or 1) > 1 else None


def ready() -> None:
    """Get a worker ready ahead of real work: the process started, the resize compiled."""
    from render_service.multimodal.resample import warm_up  # numba: see qwen2_vl.process_image

    warm_up()


def _grid(height: int, width: int, vision: VisionConfig) -> tuple[int, int, int]:
    try:
        return patch_grid(height, width, vision)
    except InvalidRequest as exc:
        raise ValueError(exc.message) from exc


def header_grid(data: bytes, max_pixels: int, vision: VisionConfig) -> tuple[int, int, int]:
    """The image's patch grid, from its header alone (cheap: run inline)."""
    width, height = open_header(data, max_pixels)
    return _grid(height, width, vision)


class Decoded(msgspec.Struct, frozen=True, kw_only=True):
    """One image past the steps that can fail: checked, hashed, and decoded unless cached."""

    mm_hash: str
    cache_key: tuple[str, VisionConfig]
    pixels: NDArray[np.uint8] | None  # None when ``cached`` holds the patch rows
    cached: Patches | None
    grid_thw: tuple[int, int, int]
    num_tokens: int


def decode(job: Job) -> Decoded:
    """Check, hash and decode one image (or find its patches in the cache)."""
    image = open_lazily(job.data, job.max_pixels)
    converted = image.mode != "RGB"
    io_config = (
        {"image_mode": "RGB", "rgba_background_color": job.background} if converted else None
    )
    encoded = EncodedImage(job.data, io_config)
    content = image_hash(job.model_id, encoded, job.mm_kwargs, job.io_kwargs, None)
    mm_hash = (
        content
        if job.uuid is None
        else image_hash(job.model_id, encoded, job.mm_kwargs, job.io_kwargs, job.uuid)
    )
    key = (content, job.vision)
    cache = _cache(job)
    cached = cache.get(key) if cache is not None else None
    if cached is not None:
        return Decoded(
            mm_hash=mm_hash,
            cache_key=key,
            pixels=None,
            cached=cached,
            grid_thw=cached.grid_thw,
            num_tokens=cached.num_tokens,
        )
    pixels = decode_rgb(image, job.data, job.background)
    grid = _grid(pixels.shape[0], pixels.shape[1], job.vision)
    return Decoded(
        mm_hash=mm_hash,
        cache_key=key,
        pixels=pixels,
        cached=None,
        grid_thw=grid,
        num_tokens=grid[1] * grid[2] // job.vision.merge_size**2,
    )


def finish(job: Job, decoded: Decoded, send: Callable[[bytes], None] | None = None) -> MediaItem:
    """Resize into patch rows (or copy the cached ones) and serialize them.

    With ``send``, the item's base64 goes there in pieces while the rows are being made, and
    the returned item carries none.
    """
    item = rows = pieces = None
    rows_at = 0
    row_width = patch_row_width(job.vision)
    if job.slices is not None:
        item, rows, rows_at = serialize.image_item(decoded.grid_thw, row_width, job.slices)
        if send is not None:
            pieces = serialize.Base64Pieces(item, send)
    if decoded.cached is not None:
        if rows is not None:
            rows[:] = decoded.cached.rows
    else:
        assert decoded.pixels is not None
        progress = None if pieces is None else _rows_to(pieces, rows_at, row_width)
        try:
            processed = process_image(decoded.pixels, job.vision, rows, helper(), progress)
        except InvalidRequest as exc:
            raise ValueError(exc.message) from exc
        cache = _cache(job)
        if cache is not None:
            cache.put(
                decoded.cache_key,
                Patches(
                    rows=processed.pixel_values,
                    grid_thw=processed.grid_thw,
                    num_tokens=processed.num_tokens,
                ),
            )
    if item is None:
        return MediaItem(
            mm_hash=decoded.mm_hash,
            num_tokens=decoded.num_tokens,
            kwargs_data=None,
            kwargs_data_base64=None,
            mm_metadata=None,
        )
    if pieces is not None:
        pieces.close()
    return MediaItem(
        mm_hash=decoded.mm_hash,
        num_tokens=decoded.num_tokens,
        kwargs_data=item,
        kwargs_data_base64=None if pieces is not None else pybase64.b64encode(item),
        mm_metadata=serialize.metadata_item(decoded.grid_thw),
    )


def run(job: Job) -> MediaItem:
    """Decode, preprocess, hash and serialize one image (its patches from the cache if seen)."""
    return finish(job, decode(job))


def _rows_to(pieces: serialize.Base64Pieces, rows_at: int, row_width: int) -> Callable[[int], None]:
    """A resize ``progress`` callback that sends the item's base64 as far as its rows go."""
    return lambda done: pieces.filled(rows_at + done * row_width)


def _cache(job: Job) -> PatchCache | None:
    return patch_cache(job.cache_bytes) if job.cache_bytes > 0 else None
