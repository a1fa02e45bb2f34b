"""The CPU-heavy image steps, as plain functions of picklable values.

They run in the media pool: threads by default (numpy and Pillow release the GIL for the heavy
steps), or processes with ``--media-executor process`` (nothing can hold the server's GIL, and a
crash in an image decoder stays in the worker). Errors are ``ValueError`` with a client-facing
reason; the caller adds which message and part failed.
"""

from __future__ import annotations

from typing import Any

import msgspec

from render_service.errors import InvalidRequest
from render_service.multimodal import serialize
from render_service.multimodal.decode import open_header, open_image, to_rgb
from render_service.multimodal.hashing import EncodedImage, image_hash
from render_service.multimodal.qwen2_vl import VisionConfig, process_image, smart_resize


class MediaItem(msgspec.Struct, frozen=True, kw_only=True):
    """One image ready for the GenerateRequest: hash, token count and serialized tensors."""

    mm_hash: str
    num_tokens: int
    kwargs_data: bytes | None  # msgpack; JSON-encoded as base64 text
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


def ready() -> None:
    """Get a worker ready ahead of real work: the process started, the resize compiled."""
    from render_service.multimodal.resample import warm_up  # numba: see qwen2_vl.process_image

    warm_up()


def patch_rows(data: bytes, max_pixels: int, vision: VisionConfig) -> int:
    """How many patch rows the image will have, from its header alone (cheap: run inline)."""
    width, height = open_header(data, max_pixels)
    try:
        resized_h, resized_w = smart_resize(height, width, vision)
    except InvalidRequest as exc:
        raise ValueError(exc.message) from exc
    return (resized_h // vision.patch_size) * (resized_w // vision.patch_size)


def run(job: Job) -> MediaItem:
    """Decode, preprocess, hash and serialize one image."""
    image = open_image(job.data, job.max_pixels)
    converted = image.mode != "RGB"
    try:
        processed = process_image(to_rgb(image, job.background), job.vision)
    except InvalidRequest as exc:
        raise ValueError(exc.message) from exc
    io_config = (
        {"image_mode": "RGB", "rgba_background_color": job.background} if converted else None
    )
    mm_hash = image_hash(
        job.model_id, EncodedImage(job.data, io_config), job.mm_kwargs, job.io_kwargs, job.uuid
    )
    kwargs_data = metadata = None
    if job.slices is not None:
        grid = serialize.grid_field(processed.grid_thw)
        kwargs_data = serialize.encode_item(
            {
                "image_grid_thw": grid,
                "pixel_values": serialize.pixel_field(processed.pixel_values, job.slices),
            }
        )
        metadata = serialize.encode_item({"image_grid_thw": grid})
    return MediaItem(
        mm_hash=mm_hash,
        num_tokens=processed.num_tokens,
        kwargs_data=kwargs_data,
        mm_metadata=metadata,
    )
