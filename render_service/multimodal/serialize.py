"""``kwargs_data`` / ``mm_metadata`` items in the msgpack layout of vLLM's MsgpackEncoder.

One item is a map from field name to ``{"data": [dtype, shape, Ext(3, raw bytes)],
"field": [kind, options]}``; tensors are always inline (vLLM encodes with an infinite size
threshold) and the whole item is base64'd on the wire. ``pixel_values`` is a ``flat`` field whose
``slices`` list the rows of *every* item processed in the same batch (vLLM's layout, kept as
is); ``image_grid_thw`` is ``batched`` and kept on CPU, which is why it alone forms
``mm_metadata``.
"""

from __future__ import annotations

import base64
import ctypes
from collections.abc import Callable
from typing import Any, NamedTuple

import msgspec
import numpy as np
import pybase64
from numpy.typing import NDArray

_TENSOR_EXT = 3
_encoder = msgspec.msgpack.Encoder()

Slices = list[list[list[int | None]]]


def _tensor(array: NDArray[Any]) -> list[Any]:
    contiguous = np.ascontiguousarray(array)
    return [
        contiguous.dtype.name,
        list(contiguous.shape),
        msgspec.msgpack.Ext(_TENSOR_EXT, contiguous.data.cast("B")),
    ]


def grid_field(grid_thw: tuple[int, int, int]) -> dict[str, Any]:
    return {
        "data": _tensor(np.asarray(grid_thw, dtype="<i8")),
        "field": ["batched", {"keep_on_cpu": True}],
    }


def _flat_field(batch_slices: Slices) -> list[Any]:
    return ["flat", {"keep_on_cpu": False, "slices": batch_slices, "dim": 0}]


def pixel_field(pixel_values: NDArray[np.uint8], batch_slices: Slices) -> dict[str, Any]:
    return {"data": _tensor(pixel_values), "field": _flat_field(batch_slices)}


def _ext_header(size: int, code: int) -> bytes:
    """The msgpack header of an extension value of ``size`` bytes (the spec's shortest form)."""
    fixed = {1: 0xD4, 2: 0xD5, 4: 0xD6, 8: 0xD7, 16: 0xD8}
    if size in fixed:
        return bytes([fixed[size], code])
    if size < 1 << 8:
        return b"\xc7" + size.to_bytes(1, "big") + bytes([code])
    if size < 1 << 16:
        return b"\xc8" + size.to_bytes(2, "big") + bytes([code])
    return b"\xc9" + size.to_bytes(4, "big") + bytes([code])


# Stands in for the pixel bytes while the rest of the item is encoded; it cannot occur in an
# item otherwise (no other extension value, and no string contains it).
_SLOT = msgspec.msgpack.Ext(_TENSOR_EXT, b"render-service: pixel rows go here")


# bytearray(n) zeroes its n bytes, holding the GIL: 0.3-0.7 ms for a 720p image's item, whose
# pixel rows are then overwritten anyway. CPython's C constructor given no source leaves them
# as they are.
_new_bytearray = ctypes.pythonapi.PyByteArray_FromStringAndSize
_new_bytearray.argtypes = (ctypes.c_char_p, ctypes.c_ssize_t)
_new_bytearray.restype = ctypes.py_object


def uninitialized_bytearray(size: int) -> bytearray:
    """A bytearray of ``size`` bytes whose content is whatever the memory held."""
    item: bytearray = _new_bytearray(None, size)
    return item


class ImageItem(NamedTuple):
    item: bytearray  # the serialized item
    rows: NDArray[np.uint8]  # a view of its pixel rows
    rows_at: int  # where they start in it


def _around_rows(
    grid_thw: tuple[int, int, int], row_width: int, batch_slices: Slices
) -> tuple[bytes, bytes]:
    """An image item's bytes before its pixel rows (up to their ext header) and after them."""
    rows = grid_thw[0] * grid_thw[1] * grid_thw[2]
    skeleton = encode_item(
        {
            "image_grid_thw": grid_field(grid_thw),
            "pixel_values": {
                "data": ["uint8", [rows, row_width], _SLOT],
                "field": _flat_field(batch_slices),
            },
        }
    )
    before, after = skeleton.split(_encoder.encode(_SLOT))
    return before + _ext_header(rows * row_width, _TENSOR_EXT), after


def item_size(grid_thw: tuple[int, int, int], row_width: int, batch_slices: Slices) -> int:
    """The length of ``image_item``'s item."""
    before, after = _around_rows(grid_thw, row_width, batch_slices)
    return len(before) + grid_thw[0] * grid_thw[1] * grid_thw[2] * row_width + len(after)


def image_item(grid_thw: tuple[int, int, int], row_width: int, batch_slices: Slices) -> ImageItem:
    """One image's ``kwargs_data`` item with its pixel rows still to fill, and a view of them.

    The patch rows are written straight into the serialized item, not copied there after; the
    caller must write every row (they start as garbage, not zeros).
    """
    rows = grid_thw[0] * grid_thw[1] * grid_thw[2]
    size = rows * row_width
    before, after = _around_rows(grid_thw, row_width, batch_slices)
    item = uninitialized_bytearray(len(before) + size + len(after))
    start = len(before)
    item[:start] = before
    item[start + size :] = after
    pixels = np.frombuffer(item, np.uint8, count=size, offset=start).reshape(rows, row_width)
    return ImageItem(item, pixels, start)


def metadata_item(grid_thw: tuple[int, int, int]) -> bytes:
    """One image's ``mm_metadata`` item."""
    return encode_item({"image_grid_thw": grid_field(grid_thw)})


class Base64Pieces:
    """The base64 of a buffer that fills from the front, sent in pieces as it fills.

    Each piece but the last covers a multiple of 3 bytes, so the pieces join into the base64
    of the whole buffer.
    """

    def __init__(self, buffer: bytearray, send: Callable[[bytes], None]) -> None:
        self._view = memoryview(buffer)
        self._send = send
        self._done = 0

    def filled(self, end: int) -> None:
        """Bytes up to ``end`` are final: send what of them whole groups cover."""
        end = self._done + (end - self._done) // 3 * 3
        if end > self._done:
            self._send(pybase64.b64encode(self._view[self._done : end]))
            self._done = end

    def close(self) -> None:
        """Send the rest, padded: the buffer is complete."""
        if self._done < len(self._view):
            self._send(pybase64.b64encode(self._view[self._done :]))
            self._done = len(self._view)


def encoded_size(size: int) -> int:
    """The length of the base64 of ``size`` bytes."""
    return -(-size // 3) * 4


def batch_slices(row_counts: list[int]) -> Slices:
    """``[[[start, stop, None]], ...]``: each item's rows in the concatenated batch."""
    out: Slices = []
    start = 0
    for rows in row_counts:
        out.append([[start, start + rows, None]])
        start += rows
    return out


def encode_item(fields: dict[str, Any]) -> bytes:
    """The item's msgpack bytes. They stay bytes until the response is written: msgspec's
    JSON encoder writes bytes as base64 text (what vLLM sends), and bytes cross a process
    boundary faster than the 4/3-longer string."""
    return _encoder.encode(fields)


def decode_item(data: str | bytes) -> dict[str, dict[str, Any]]:
    """Decode one item to ``{field: {"array": ndarray, "field": [kind, options]}}`` (for tests)."""

    def ext(code: int, raw: memoryview) -> bytes:
        if code != _TENSOR_EXT:
            raise ValueError(f"unexpected msgpack extension {code}")
        return bytes(raw)

    raw = base64.b64decode(data) if isinstance(data, str) else data
    item = msgspec.msgpack.decode(raw, ext_hook=ext)
    out = {}
    for name, elem in item.items():
        dtype, shape, raw = elem["data"]
        array = np.frombuffer(raw, dtype=np.dtype(dtype).newbyteorder("<")).reshape(shape)
        out[name] = {"array": array, "field": elem["field"]}
    return out
