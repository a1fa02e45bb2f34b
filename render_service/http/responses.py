"""Response classes whose ``render`` is a msgspec encode, and JSON bodies sent in pieces.

An image render answers with megabytes of base64 (``features.kwargs_data``). Encoding that into
one JSON buffer costs a base64 pass plus every re-allocation of a growing buffer; instead the
response is encoded with a marker where each payload goes, split at the markers, and the
payloads, base64'd with SIMD (by the media workers, in parallel), are sent between the pieces:
nothing is concatenated.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any, Protocol, TypeVar

import msgspec
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

# A NUL byte never appears in msgspec's JSON output (control characters in strings are
# escaped), so splitting there is unambiguous.
_MARK = b"\x00"
_SLOT = msgspec.Raw(b'"' + _MARK + b'"')
_encoder = msgspec.json.Encoder()
_msgpack = msgspec.msgpack.Encoder()
T = TypeVar("T")


class Streamed(Protocol):
    """A payload sent as it is made (``multimodal.Payload``): its length is known up front."""

    size: int

    def pieces(self) -> AsyncIterator[bytes]: ...


def _with_slots(features: dict[str, Any]) -> dict[str, Any]:
    """``features`` with each ``kwargs_data`` item replaced by a slot."""
    kwargs_data = features.get("kwargs_data")
    if not kwargs_data:
        return features
    slotted = {modality: [_SLOT] * len(items) for modality, items in kwargs_data.items()}
    return {**features, "kwargs_data": slotted}


def encode_parts(result: Any, encoded: Sequence[T]) -> list[bytes | T]:
    """The JSON of a render result (a GenerateRequest struct) as pieces to send in order.

    ``encoded``: the base64 of each ``kwargs_data`` item, in order (the media workers make it),
    or whatever stands for it (a stream of it, say): the JSON goes around them.
    """
    features = getattr(result, "features", None)
    if features:
        result = msgspec.structs.replace(result, features=_with_slots(features))
    pieces = _encoder.encode(result).split(_MARK)
    parts: list[bytes | T] = [pieces[0]]
    for text, piece in zip(encoded, pieces[1:], strict=True):
        parts.append(text)
        parts.append(piece)
    return parts


class MsgspecResponse(Response):
    media_type = "application/json"

    def __init__(
        self, content: Any, status_code: int = 200, headers: Mapping[str, str] | None = None
    ) -> None:
        if headers is not None:
            super().__init__(content, status_code, headers)
            return
        # The common case, once per streamed chunk: its two headers without Starlette's merging.
        self.status_code = status_code
        self.background = None
        self.body = body = self.render(content)
        self.raw_headers = [(b"content-length", b"%d" % len(body)), self._content_type]

    _content_type = (b"content-type", b"application/json")

    def render(self, content: Any) -> bytes:
        return _encoder.encode(content)


class MsgpackResponse(MsgspecResponse):
    media_type = "application/msgpack"
    _content_type = (b"content-type", b"application/msgpack")

    def render(self, content: Any) -> bytes:
        return _msgpack.encode(content)


class PartsResponse(Response):
    """A JSON body cut into pieces (``encode_parts``), sent one after another; payloads that
    are still being made are sent piece by piece as they come."""

    media_type = "application/json"

    def __init__(self, parts: Sequence[bytes | Streamed]) -> None:
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
