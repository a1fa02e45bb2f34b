"""Hypothesis fuzzing of stream_state decoding, from the codec up to a real derenderer.

Whatever a client puts in ``stream_state`` (random text, random bytes behind a valid header, any
JSON value, vLLM-shaped states with hostile ids, altered real tokens), the only exception is a
RenderServiceError (a 4xx), and the states we issue stay under the server's limit.
"""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from render_service import Renderer
from render_service.derender import Derenderer, build_derenderer
from render_service.derender.stream_state import VERSION, StateCodec
from render_service.errors import RenderServiceError, StreamStateError
from render_service.model.default_model import ensure_default_model
from render_service.protocol.derender import DerenderChatStreamRequest

FUZZ = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
TOOLS = [
    {
        "type": "function",
        "function": {"name": "get_weather", "parameters": {"type": "object"}},
    }
]
CHAT = {"messages": [{"role": "user", "content": "Weather?"}], "tools": TOOLS, "stream": True}
MAX_STATE = 16384

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=20,
)
hostile_ids = st.lists(st.integers(-(2**40), 2**40) | st.integers(0, 200_000), max_size=20)


class Sample(msgspec.Struct):
    a: int
    b: str


@FUZZ
@given(token=st.text(max_size=300))
def test_codec_rejects_random_text_cleanly(token: str) -> None:
    codec = StateCodec(b"k" * 32, b"ctx", max_bytes=256)
    with pytest.raises(StreamStateError):
        codec.decode(token, Sample)


@FUZZ
@given(payload=st.binary(max_size=200), flags=st.integers(0, 255))
def test_codec_rejects_random_bytes_behind_a_valid_header(payload: bytes, flags: int) -> None:
    codec = StateCodec(b"k" * 32, b"ctx", max_bytes=1024)
    token = base64.urlsafe_b64encode(bytes((VERSION, flags)) + payload).rstrip(b"=").decode()
    with pytest.raises(StreamStateError):
        codec.decode(token, Sample)


@pytest.fixture(scope="module")
def derenderer(tmp_path_factory: pytest.TempPathFactory) -> Derenderer:
    model: Path = ensure_default_model(tmp_path_factory.mktemp("model"))
    renderer = Renderer.from_pretrained(
        str(model),
        served_model_name="default",
        enable_auto_tool_choice=True,
        tool_call_parser="hermes",
        state_secret="fuzz-secret",
        max_stream_state_bytes=MAX_STATE,
    )
    return build_derenderer(renderer.model, renderer.parsing, renderer.settings)


def chunk(ids: list[int], state: Any, *, first: bool) -> DerenderChatStreamRequest:
    body: dict[str, Any] = {
        "stream": True,
        "stream_state": state,
        "generate_chunk": {
            "request_id": "generate-tokens-chatcmpl-fuzz",
            "choices": [{"index": 0, "finish_reason": None, "token_ids": ids}],
        },
    }
    if first:
        body["prompt_token_ids"] = [1, 2, 3]
        body["chat_request"] = CHAT
    return msgspec.convert(body, DerenderChatStreamRequest)


def only_4xx(derenderer: Derenderer, request: DerenderChatStreamRequest) -> dict[str, Any] | None:
    try:
        return msgspec.to_builtins(derenderer.derender_chat_stream(request))
    except RenderServiceError as exc:
        assert 400 <= exc.status < 500
        return None


@FUZZ
@given(state=json_values, first=st.booleans())
def test_any_json_value_as_state_is_a_4xx_or_a_chunk(
    derenderer: Derenderer, state: Any, first: bool
) -> None:
    only_4xx(derenderer, chunk([1], state, first=first))


@FUZZ
@given(history=hostile_ids, lens=st.lists(st.integers(-5, 30), max_size=5), first=st.booleans())
def test_vllm_shaped_states_with_hostile_ids(
    derenderer: Derenderer, history: list[int], lens: list[int], first: bool
) -> None:
    state = {"output_token_ids": history, "output_chunk_lens": lens}
    only_4xx(derenderer, chunk([1], state, first=first))


@FUZZ
@given(data=st.data())
def test_altered_real_states_and_long_streams(derenderer: Derenderer, data: st.DataObject) -> None:
    vocab = derenderer.model.vocab_size
    ids = data.draw(st.lists(st.integers(0, vocab - 1), min_size=1, max_size=8), label="first")
    result = only_4xx(derenderer, chunk(ids, None, first=True))
    assert result is not None
    state = result["stream_state"]
    for _ in range(data.draw(st.integers(1, 6), label="chunks")):
        ids = data.draw(st.lists(st.integers(0, vocab + 50), max_size=30), label="ids")
        if data.draw(st.booleans(), label="alter"):
            position = data.draw(st.integers(0, len(state) - 1), label="position")
            altered = state[:position] + data.draw(st.sampled_from("A_-.0z"), label="char")
            altered += state[position + 1 :]
            only_4xx(derenderer, chunk(ids, altered, first=False))
            continue
        result = only_4xx(derenderer, chunk(ids, state, first=False))
        if result is None:
            return
        state = result["stream_state"]
        assert len(state) <= MAX_STATE
