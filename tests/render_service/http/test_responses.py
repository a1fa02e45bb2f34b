"""A response sent in pieces is byte for byte the JSON msgspec would write in one go."""

from __future__ import annotations

import asyncio
import base64
from collections.abc import AsyncIterator, MutableMapping
from typing import Any

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from render_service.http.responses import PartsResponse, encode_parts
from render_service.protocol.generate import GenerateRequest

texts = st.text(st.characters(codec="utf-8"), max_size=20)  # NUL and other controls included
payload_lists = st.lists(st.binary(max_size=300), max_size=4)


@settings(max_examples=200, deadline=None)
@given(
    images=payload_lists,
    videos=payload_lists,
    metadata=st.lists(st.binary(max_size=40), max_size=3),
    prompt=texts,
    request_id=texts,
)
def test_pieces_join_to_the_one_shot_encoding(
    images: list[bytes], videos: list[bytes], metadata: list[bytes], prompt: str, request_id: str
) -> None:
    features: dict[str, Any] = {
        "mm_hashes": {"image": [prompt] * len(images)},
        "kwargs_data": {"image": images, "video": videos},
        "mm_metadata": {"image": metadata},
        "mm_payload": "none",
    }
    result = GenerateRequest(
        request_id=request_id,
        token_ids=[1, 2, 3],
        features=features,
        sampling_params={"stop": [prompt]},
    )
    encoded = [base64.b64encode(payload) for payload in images + videos]  # as the workers do
    parts = encode_parts(result, encoded)
    assert b"".join(parts) == msgspec.json.encode(result)
    # Every payload went out as a piece of its own, never copied into the JSON around it.
    assert len(parts) == 1 + 2 * (len(images) + len(videos))


def test_results_without_payloads_are_one_piece() -> None:
    for features in (None, {"mm_hashes": {"image": ["a"]}, "kwargs_data": None}):
        result = GenerateRequest(request_id="r", token_ids=[5], features=features)
        assert encode_parts(result, []) == [msgspec.json.encode(result)]


class _Pieces:
    """A payload whose pieces are already known (``Payload``'s interface)."""

    def __init__(self, pieces: list[bytes | BaseException]) -> None:
        self._pieces = pieces
        self.size = sum(len(p) for p in pieces if isinstance(p, bytes))

    async def pieces(self) -> AsyncIterator[bytes]:
        for piece in self._pieces:
            if isinstance(piece, BaseException):
                raise piece
            yield piece


def _sent(parts: list[Any]) -> tuple[list[MutableMapping[str, Any]], BaseException | None]:
    messages: list[MutableMapping[str, Any]] = []

    async def send(message: MutableMapping[str, Any]) -> None:
        messages.append(message)

    async def receive() -> dict[str, Any]:
        return {"type": "http.disconnect"}

    try:
        asyncio.run(PartsResponse(parts)({"type": "http"}, receive, send))
    except RuntimeError as exc:
        return messages, exc
    return messages, None


@pytest.mark.parametrize("last_is_payload", [False, True])
def test_streamed_payloads_go_out_between_the_json_pieces(last_is_payload: bool) -> None:
    parts: list[Any] = [b'{"a":"', _Pieces([b"QUJD", b"REVG"]), b'"}']
    if last_is_payload:
        parts = parts[:2]
    messages, error = _sent(parts)
    assert error is None
    headers = dict(messages[0]["headers"])
    body = b"".join(m["body"] for m in messages[1:])
    assert int(headers[b"content-length"]) == len(body)
    assert body == (b'{"a":"QUJDREVG"}' if not last_is_payload else b'{"a":"QUJDREVG')
    assert [m["more_body"] for m in messages[1:]][-1] is False
    assert all(m["more_body"] for m in messages[1:-1])


def test_a_payload_that_fails_stops_the_body_short() -> None:
    # Once the status line is out a 400 is impossible: the body ends short of its
    # content-length, so the client sees a broken response, never a wrong one.
    messages, error = _sent([b'{"a":"', _Pieces([b"QUJD", RuntimeError("no")]), b'"}'])
    assert isinstance(error, RuntimeError)
    assert all(m.get("more_body", True) for m in messages[1:])
    sent = sum(len(m["body"]) for m in messages[1:])
    assert sent < int(dict(messages[0]["headers"])[b"content-length"])
