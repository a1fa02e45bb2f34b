"""Turning image bytes into an RGB array, defensively (runs in the media pool).

The format is sniffed from the bytes, never taken from a content type or a data-URL header,
so a PNG labelled ``image/jpeg`` still decodes and a text file labelled ``image/png`` is refused.
The pixel count is checked from the header before any pixel is decoded (decompression bombs),
and truncated or corrupt data raises instead of being padded.
"""

from __future__ import annotations

import io
import warnings
from typing import Any

import numpy as np
from numpy.typing import NDArray
from PIL import Image, UnidentifiedImageError

_SIGNATURES: tuple[tuple[bytes, str], ...] = (
    (b"\x89PNG\r\n\x1a\n", "PNG"),
    (b"\xff\xd8\xff", "JPEG"),
    (b"GIF87a", "GIF"),
    (b"GIF89a", "GIF"),
    (b"BM", "BMP"),
    (b"II*\x00", "TIFF"),
    (b"MM\x00*", "TIFF"),
)


def sniff_format(data: bytes) -> str | None:
    """The image format the bytes start with, or None."""
    if len(data) >= 12 and data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "WEBP"
    for signature, name in _SIGNATURES:
        if data.startswith(signature):
            return name
    return None


def open_lazily(data: bytes, max_pixels: int) -> Image.Image:
    """Parse the header only; ValueError when the bytes are no image or claim too many pixels.

    The pixels are decoded by ``load_pixels``, if they are needed at all.
    """
    fmt = sniff_format(data)
    if fmt is None:
        raise ValueError("the data is not a PNG, JPEG, WebP, GIF, BMP or TIFF image")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            image = Image.open(io.BytesIO(data), formats=[fmt])
    except Image.DecompressionBombError as exc:
        raise ValueError(f"the image has too many pixels ({exc})") from exc
    except UnidentifiedImageError as exc:
        raise ValueError(f"cannot decode the {fmt} image") from exc
    except (OSError, SyntaxError, EOFError) as exc:
        raise ValueError(f"the {fmt} image is truncated or corrupt ({exc})") from exc
    width, height = image.size
    if width * height > max_pixels:
        raise ValueError(_too_many_pixels(width, height, max_pixels))
    return image


def open_header(data: bytes, max_pixels: int) -> tuple[int, int]:
    """(width, height) from the header, with the same checks as ``open_lazily``."""
    return open_lazily(data, max_pixels).size


def load_pixels(image: Image.Image) -> Image.Image:
    """Decode an image ``open_lazily`` returned; ValueError when it is truncated or corrupt."""
    try:
        image.load()
    except (OSError, SyntaxError, EOFError, ValueError) as exc:
        raise ValueError(f"the {image.format} image is truncated or corrupt ({exc})") from exc
    return image


def _too_many_pixels(width: int, height: int, limit: int) -> str:
    return (
        f"the image is {width}x{height} pixels, more than the limit of {limit} (--max-image-pixels)"
    )


def to_rgb(image: Image.Image, background: tuple[int, int, int]) -> NDArray[np.uint8]:
    """RGB pixels as vLLM converts them: RGBA over a solid background, other modes via Pillow."""
    if image.mode == "RGB":
        rgb = image
    elif image.mode == "RGBA":
        rgb = Image.new("RGB", image.size, background)
        rgb.paste(image, mask=image.getchannel("A"))
    else:
        rgb = image.convert("RGB")
    array: Any = np.asarray(rgb)
    return np.ascontiguousarray(array, dtype=np.uint8)
