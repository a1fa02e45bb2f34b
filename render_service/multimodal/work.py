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
from typing import Any

import msgspec
import pybase64
from PIL import Image

from render_service.errors import InvalidRequest
from render_service.multimodal import serialize
from render_service.multimodal.cache import Patches, patch_cache
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


def patch_rows(data: bytes, max_pixels: int, vision: VisionConfig) -> int:
    """How many patch rows the image will have, from its header alone (cheap: run inline)."""
    width, height = open_header(data, max_pixels)
    _, grid_h, grid_w = _grid(height, width, vision)
    return grid_h * grid_w


def _process(job: Job, image: Image.Image) -> tuple[bytearray | None, Patches]:
    """Decode and preprocess; the patch rows land straight in the serialized item, if any."""
    rgb = decode_rgb(image, job.data, job.background)
    grid = _grid(rgb.shape[0], rgb.shape[1], job.vision)
    item = rows = None
    if job.slices is not None:
        item, rows = serialize.image_item(grid, patch_row_width(job.vision), job.slices)
    try:
        processed = process_image(rgb, job.vision, out=rows, helper=helper())
    except InvalidRequest as exc:
        raise ValueError(exc.message) from exc
    patches = Patches(
        rows=processed.pixel_values, grid_thw=processed.grid_thw, num_tokens=processed.num_tokens
    )
    return item, patches


def _item_from(patches: Patches, slices: serialize.Slices) -> bytearray:
    item, rows = serialize.image_item(patches.grid_thw, patches.rows.shape[1], slices)
    rows[:] = patches.rows
    return item


def run(job: Job) -> MediaItem:
    """Decode, preprocess, hash and serialize one image (its patches from the cache if seen)."""
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
    cache = patch_cache(job.cache_bytes) if job.cache_bytes > 0 else None
    key = (content, job.vision)
    patches = cache.get(key) if cache is not None else None
    if patches is None:
        item, patches = _process(job, image)
        if cache is not None:
            cache.put(key, patches)
    else:
        item = None if job.slices is None else _item_from(patches, job.slices)
    metadata = None
    if item is not None:
        metadata = serialize.encode_item({"image_grid_thw": serialize.grid_field(patches.grid_thw)})
    return MediaItem(
        mm_hash=mm_hash,
        num_tokens=patches.num_tokens,
        kwargs_data=item,
        kwargs_data_base64=None if item is None else pybase64.b64encode(item),
        mm_metadata=metadata,
    )
