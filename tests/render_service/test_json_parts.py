"""A response sent in pieces is byte for byte the JSON msgspec would write in one go."""

from __future__ import annotations

import base64
from typing import Any

import msgspec
from hypothesis import given, settings
from hypothesis import strategies as st

from render_service.json_parts import encode_parts
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
