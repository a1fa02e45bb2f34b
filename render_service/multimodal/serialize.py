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
from typing import Any

import msgspec
import numpy as np
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


def pixel_field(pixel_values: NDArray[np.uint8], batch_slices: Slices) -> dict[str, Any]:
    return {
        "data": _tensor(pixel_values),
        "field": ["flat", {"keep_on_cpu": False, "slices": batch_slices, "dim": 0}],
    }


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
