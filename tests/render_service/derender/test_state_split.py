"""A stream state is a constant part signed once and a moving part signed each chunk, bound to it.

Either part altered, parts of two streams mixed, or a state from another version: a 400 in
vLLM's error shape. A replica that has cached nothing continues any stream. Runs on the embedded
default model (no ../shared).
"""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

import msgspec
import pytest
from starlette.testclient import TestClient

from render_service.derender import machine, stream_state
from render_service.derender.machine import StreamFixed
from render_service.derender.stream_state import StateCodec
from render_service.derender.streams import StreamStates
from render_service.model import parser_setup
from tests.render_service.derender._streams import (
    CHAT,
    PATH,
    chunk,
    client_for,
    run_stream,
    setup,
    single_stream,
)

Setup = tuple[TestClient, Any, list[int], list[int]]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return Path(tmp_path_factory.mktemp("split-model"))


@pytest.fixture(scope="module")
def server(model_dir: Path) -> Setup:
    return setup(model_dir)


def streams_of(client: TestClient) -> StreamStates:
    streams: StreamStates = client.app.state.service.derenderer.streams  # type: ignore[attr-defined]
    return streams


def first_calls(
    client: TestClient, prompt: list[int], output: list[int], request_id: str, calls: int = 3
) -> list[str]:
    """The states after each of the first ``calls`` chunks of a stream."""
    state: Any = None
    states = []
    for i in range(calls):
        body: dict[str, Any] = {
            "stream": True,
            "generate_chunk": chunk(request_id, output[i : i + 1], False),
            "stream_state": state,
        }
        if state is None:
            body |= {"prompt_token_ids": prompt, "chat_request": CHAT}
        response = client.post(PATH, json=body)
        assert response.status_code == 200, response.text
        state = response.json()["stream_state"]
        states.append(state)
    return states


def continue_with(client: TestClient, state: str, token: int, request_id: str) -> Any:
    body = {"stream": True, "generate_chunk": chunk(request_id, [token], False)}
    return client.post(PATH, json={**body, "stream_state": state})


def assert_refused(response: Any, words: str) -> None:
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["param"] == "stream_state"
    assert error["code"] == 400
    assert words in error["message"], error["message"]


def flip(part: str) -> str:
    raw = bytearray(base64.urlsafe_b64decode(part + "=" * (-len(part) % 4)))
    raw[len(raw) // 2] ^= 0x01
    return base64.urlsafe_b64encode(bytes(raw)).rstrip(b"=").decode()


def test_the_constant_part_is_signed_once_and_the_moving_part_each_chunk(server: Setup) -> None:
    client, _, prompt, output = server
    states = first_calls(client, prompt, output, "split-once", calls=4)
    parts = [state.split(".") for state in states]
    assert all(len(p) == 3 for p in parts)
    assert len({p[1] for p in parts}) == 1  # the same constant part, character for character
    assert len({p[2] for p in parts}) == len(parts)


@pytest.mark.parametrize("part", [1, 2], ids=["constant", "moving"])
def test_either_part_altered_is_refused(server: Setup, part: int) -> None:
    client, _, prompt, output = server
    state = first_calls(client, prompt, output, f"split-tamper-{part}")[-1]
    parts = state.split(".")
    parts[part] = flip(parts[part])
    tampered = ".".join(parts)
    # With the cache hint (the entry is then checked out and compared) and without it.
    assert_refused(continue_with(client, tampered, output[3], f"split-tamper-{part}"), "verif")
    unhinted = ".".join(parts[1:])
    assert_refused(continue_with(client, unhinted, output[3], f"split-tamper-{part}"), "verif")


def test_parts_of_two_streams_or_two_calls_do_not_mix(server: Setup) -> None:
    client, _, prompt, output = server
    a = first_calls(client, prompt, output, "split-mix")
    b = first_calls(client, prompt, output, "split-mix-other")
    a_parts, b_parts = a[-1].split("."), b[-1].split(".")
    mixed = f"{a_parts[1]}.{b_parts[2]}"
    assert_refused(continue_with(client, mixed, output[3], "split-mix"), "verification")
    # A moving part of the same stream but from an earlier call is a valid, older state: it is
    # accepted (a client may retry a call), as a whole earlier token always was.
    earlier = a[0].split(".")
    response = continue_with(client, f"{a_parts[1]}.{earlier[2]}", output[1], "split-mix")
    assert response.status_code == 200, response.text


def test_a_replica_with_empty_caches_continues_the_stream(model_dir: Path, server: Setup) -> None:
    """Every chunk goes to the other replica; one of them keeps no cache at all."""
    client, _, prompt, output = server
    cold = client_for(model_dir, parser_cache_entries=0, stream_constants_cache_bytes=0)
    expected = single_stream(client, prompt, output, "split-replicas")
    got = [answer for _, answer in run_stream([client, cold], prompt, output, "split-replicas")]
    assert got == expected
    assert len(streams_of(cold).constants) == 0


def test_a_replica_verifies_a_constant_part_once(
    model_dir: Path, server: Setup, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The second replica verifies the constant part on the first chunk it sees, then reads
    it from its cache; the parser cache key is computed once per stream too."""
    client, _, prompt, output = server
    other = client_for(model_dir, parser_cache_entries=0)
    states = first_calls(client, prompt, output, "split-verify-once", calls=1)
    opened: list[str] = []
    keys: list[object] = []
    real_open, real_key = StateCodec.open, parser_setup.parser_key

    def counting_open(self: StateCodec, token: object, type_: Any, binding: bytes = b"") -> Any:
        if type_ is StreamFixed:
            opened.append(str(token))
        return real_open(self, token, type_, binding)

    def counting_key(request: Any) -> Any:
        keys.append(request)
        return real_key(request)

    monkeypatch.setattr(StateCodec, "open", counting_open)
    monkeypatch.setattr(parser_setup, "parser_key", counting_key)
    monkeypatch.setattr(machine, "parser_key", counting_key)
    state = states[-1]
    for i in range(1, 6):
        response = continue_with(other, state, output[i], "split-verify-once")
        assert response.status_code == 200, response.text
        state = response.json()["stream_state"]
    assert len(opened) == 1
    assert len(keys) == 1
    size = streams_of(other).constants.size()
    assert size.name == "stream_constants" and size.entries >= 1 and size.bytes > 0


def test_the_constant_cache_is_bounded_by_bytes(model_dir: Path, server: Setup) -> None:
    _, _, prompt, output = server
    small = client_for(model_dir, stream_constants_cache_bytes=32 * 1024)
    for k in range(8):
        first_calls(small, prompt, output, f"split-bounded-{k}", calls=1)
    size = streams_of(small).constants.size()
    assert 0 < size.bytes <= 32 * 1024
    assert size.entries < 8
    small.post("/v1/chat/completions/render", json=CHAT)
    metrics = small.get("/metrics")
    assert 'render_service_cache_bytes{cache="stream_constants"}' in metrics.text


def test_a_state_of_another_version_is_refused(
    server: Setup, monkeypatch: pytest.MonkeyPatch
) -> None:
    client, _, prompt, output = server
    state = first_calls(client, prompt, output, "split-version")[-1]
    hint, fixed, moving = state.split(".")
    raw = bytearray(base64.urlsafe_b64decode(moving + "=" * (-len(moving) % 4)))
    raw[0] = stream_state.VERSION + 1
    future = base64.urlsafe_b64encode(bytes(raw)).rstrip(b"=").decode()
    assert_refused(
        continue_with(client, f"{hint}.{fixed}.{future}", output[3], "split-version"), "version"
    )
    # A version-1 token (one signed part after the cache hint), signed with this server's key.
    current = stream_state.VERSION
    monkeypatch.setattr(stream_state, "VERSION", 1)
    codec = streams_of(client).codecs["chat"]
    old = codec.encode(msgspec.Raw(b"\x90"))  # type: ignore[arg-type]
    monkeypatch.setattr(stream_state, "VERSION", current)
    for token in (f"{hint}.{old}", old):
        response = continue_with(client, token, output[3], "split-version")
        assert_refused(response, "version 1")
        assert "restart the stream" in response.json()["error"]["message"]


def test_the_state_stays_small(server: Setup) -> None:
    """The moving part is a few hundred characters; the whole token is bounded by
    --max-stream-state-bytes however long the stream."""
    client, _, prompt, output = server
    for state, _ in run_stream([client], prompt, output, "split-small"):
        hint, _, moving = state.split(".")
        assert len(hint) == 32
        assert len(moving) < 512
        assert len(state) < 2048


def test_a_token_over_the_limit_is_refused_before_any_work(server: Setup) -> None:
    client, _, prompt, output = server
    state = first_calls(client, prompt, output, "split-limit", calls=1)[-1]
    padded = state + "A" * 20_000
    assert_refused(continue_with(client, padded, output[1], "split-limit"), "limit")


def test_streaming_derender_alone_keeps_the_cache_gauges_current(model_dir: Path) -> None:
    client, _, prompt, output = setup(model_dir)
    service = client.app.state.service  # type: ignore[attr-defined]
    service.cache_gauge_interval = 0.0  # refresh after every call, so the check below is exact
    first_calls(client, prompt, output, "gauges")
    metrics = client.get("/metrics").text
    entries = service.derenderer.cache.stats().size
    assert entries > 0
    assert f'render_service_cache_entries{{cache="stream_states"}} {float(entries)}' in metrics
