"""Multimodal item hashes (``mm_hashes``) computed the way vLLM 0.33's MultiModalHasher does.

The digest (blake3) runs over a framed byte stream, sorted by keyword name, so that distinct
inputs can never produce the same stream:

* every key and every leaf value is preceded by its byte length (8 bytes, little-endian);
* every value starts with a one-byte kind: none, sequence, mapping or leaf; sequences and
  mappings then give their element count (8 bytes, little-endian) and their elements.

For a fetched image the leaf is the *original encoded bytes*, under the key ``image``, wrapped
in a mapping with the decoder settings when the decoder had to convert the image (a non-RGB
source): ``{"io_config": {"image_mode": "RGB", "rgba_background_color": ...}, "data": bytes}``.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
from blake3 import blake3

_NONE = b"\x00"
_SEQUENCE = b"\x01"
_MAPPING = b"\x02"
_LEAF = b"\x03"


def _length(value: int) -> bytes:
    return value.to_bytes(8, "little")


def _framed(chunk: bytes) -> Iterator[bytes]:
    yield _length(len(chunk))
    yield chunk


class EncodedImage:
    """An image as the hasher sees it: the bytes the client sent, plus decoder settings if any."""

    __slots__ = ("data", "io_config")

    def __init__(self, data: bytes, io_config: dict[str, Any] | None) -> None:
        self.data = data
        self.io_config = io_config


def _leaf(value: object) -> Iterator[bytes]:
    if isinstance(value, bytes):
        yield from _framed(value)
    elif isinstance(value, str):
        yield from _framed(value.encode("utf-8"))
    elif isinstance(value, (bool, int, float)):
        yield from _framed(np.array(value).tobytes())
    elif isinstance(value, EncodedImage):
        inner: object = (
            {"io_config": value.io_config, "data": value.data} if value.io_config else value.data
        )
        yield from _item("image", inner)
    else:
        raise TypeError(f"cannot hash a {type(value).__name__}")


def _value(value: object) -> Iterator[bytes]:
    if value is None:
        yield _NONE
    elif isinstance(value, (list, tuple)):
        yield _SEQUENCE
        yield _length(len(value))
        for element in value:
            yield from _value(element)
    elif isinstance(value, dict):
        yield _MAPPING
        yield _length(len(value))
        for key, element in value.items():
            yield from _framed(str(key).encode("utf-8"))
            yield from _value(element)
    else:
        yield _LEAF
        yield from _leaf(value)


def _item(key: str, value: object) -> Iterator[bytes]:
    yield from _framed(key.encode("utf-8"))
    yield from _value(value)


def hash_kwargs(**kwargs: object) -> str:
    """blake3 hex digest of keyword values, in key order (vLLM's ``hash_kwargs``)."""
    hasher = blake3()
    for key, value in sorted(kwargs.items()):
        for chunk in _item(key, value):
            hasher.update(chunk)
    return hasher.hexdigest()


def image_hash(
    model_id: str,
    item: EncodedImage | str,
    mm_processor_kwargs: dict[str, Any],
    media_io_kwargs: dict[str, Any],
    client_uuid: str | None,
) -> str:
    """The ``mm_hashes`` entry of one image: the client uuid when no kwargs change the result."""
    factors: dict[str, object] = {}
    if media_io_kwargs:
        factors["media_io_kwargs"] = {"image": media_io_kwargs}
    scoped = {
        k: v for k, v in mm_processor_kwargs.items() if k not in ("videos_kwargs", "audio_kwargs")
    }
    if scoped:
        factors["mm_processor_kwargs"] = scoped
    if client_uuid is not None and not factors:
        return client_uuid
    hashed = client_uuid if client_uuid is not None else item
    return hash_kwargs(model_id=model_id, image=hashed, **factors)
