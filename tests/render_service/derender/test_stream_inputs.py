"""Streaming calls decode a prompt and chat request only when they are new to the stream.

vLLM's client loop resends both with every chunk; a call whose bytes equal those the stream
started from skips decoding and validating them, one whose bytes differ is checked as a first
call is (and answers the same 400s). Runs on the embedded default model (no ../shared).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from starlette.testclient import TestClient

from render_service import Renderer
from render_service.derender import inputs as inputs_module
from render_service.protocol.derender import DerenderChatStreamRequest, DerenderChatStreamWire
from tests.render_service.derender._streams import CHAT, PATH, chunk, setup, single_stream

Setup = tuple[TestClient, Renderer, list[int], list[int]]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Setup:
    return setup(Path(tmp_path_factory.mktemp("inputs-model")), max_messages=2)


def first_call(client: TestClient, prompt: list[int], output: list[int], request_id: str) -> str:
    body = {
        "stream": True,
        "generate_chunk": chunk(request_id, output[:1], False),
        "prompt_token_ids": prompt,
        "chat_request": CHAT,
    }
    response = client.post(PATH, json=body)
    assert response.status_code == 200, response.text
    state: str = response.json()["stream_state"]
    return state


def later_call(
    client: TestClient, state: str, output: list[int], request_id: str, **fields: Any
) -> Any:
    body = {"stream": True, "generate_chunk": chunk(request_id, output[1:2], False)}
    return client.post(PATH, json={**body, "stream_state": state, **fields})


def test_full_and_lean_loops_give_the_same_chunks(server: Setup) -> None:
    client, _, prompt, output = server
    full = single_stream(client, prompt, output, "generate-tokens-full")
    lean = single_stream(client, prompt, output, "generate-tokens-full", lean=True)
    assert full == lean
    assert "".join(c["choices"][0]["delta"].get("content") or "" for c in full) == "Let me check. "
    assert full[-1]["choices"][0]["finish_reason"] == "tool_calls"


def test_resent_inputs_are_decoded_once_per_stream(
    server: Setup, monkeypatch: pytest.MonkeyPatch
) -> None:
    client, _, prompt, output = server
    decoded: list[str] = []
    convert = inputs_module.convert

    def counting(value: Any, type_: Any, path: str) -> Any:
        decoded.append(path)
        return convert(value, type_, path)

    monkeypatch.setattr(inputs_module, "convert", counting)
    calls = single_stream(client, prompt, output[:6], "generate-tokens-once")
    assert len(calls) == 6
    assert decoded == ["body.chat_request"]


def test_changed_inputs_are_checked_as_on_a_first_call(
    server: Setup, monkeypatch: pytest.MonkeyPatch
) -> None:
    client, _, prompt, output = server
    state = first_call(client, prompt, output, "generate-tokens-changed")
    decoded: list[str] = []
    convert = inputs_module.convert

    def counting(value: Any, type_: Any, path: str) -> Any:
        decoded.append(path)
        return convert(value, type_, path)

    monkeypatch.setattr(inputs_module, "convert", counting)
    other = {**CHAT, "temperature": 0.5}
    fine = later_call(
        client,
        state,
        output,
        "generate-tokens-changed",
        prompt_token_ids=prompt,
        chat_request=other,
    )
    assert fine.status_code == 200, fine.text
    assert decoded == ["body.chat_request"]


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"prompt_token_ids": ["x"]}, "body.prompt_token_ids"),
        ({"prompt_token_ids": [2**40]}, "body.prompt_token_ids"),
        ({"chat_request": {"messages": "not a list"}}, "body.chat_request"),
        ({"chat_request": {**CHAT, "stop": ["weather"]}}, None),
    ],
    ids=["prompt_not_ints", "prompt_id_too_large", "chat_request_bad", "stop_strings"],
)
def test_bad_inputs_on_a_later_call_get_the_first_calls_400(
    server: Setup, fields: dict[str, Any], param: str | None
) -> None:
    client, _, prompt, output = server
    state = first_call(client, prompt, output, "generate-tokens-bad")
    response = later_call(
        client, state, output, "generate-tokens-bad", **{"prompt_token_ids": prompt, **fields}
    )
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    if param is not None:
        assert param in error["message"]
    else:
        assert "stop" in error["message"].lower()
    first = client.post(
        PATH,
        json={
            "stream": True,
            "generate_chunk": chunk("generate-tokens-bad-first", output[:1], False),
            "prompt_token_ids": prompt,
            "chat_request": CHAT,
            **fields,
        },
    )
    assert first.status_code == 400
    assert first.json()["error"]["message"] == error["message"]


def test_server_limits_apply_to_a_resent_chat_request_that_changed(server: Setup) -> None:
    client, _, prompt, output = server
    state = first_call(client, prompt, output, "generate-tokens-limit")
    many = {"messages": [{"role": "user", "content": "hi"}] * 3, "tools": CHAT["tools"]}
    response = later_call(
        client, state, output, "generate-tokens-limit", prompt_token_ids=prompt, chat_request=many
    )
    assert response.status_code == 400, response.text
    assert "--max-messages" in response.json()["error"]["message"]


def test_a_bad_state_with_bad_inputs_answers_like_a_whole_decode(server: Setup) -> None:
    client, _, _, output = server
    response = later_call(
        client, "not-a-state", output, "generate-tokens-x", prompt_token_ids=["x"]
    )
    assert response.status_code == 400
    assert "prompt_token_ids" in response.json()["error"]["message"]


def test_the_wire_body_has_the_library_bodys_fields() -> None:
    """The HTTP layer decodes streaming bodies as DerenderChatStreamWire: no field may be lost."""
    assert DerenderChatStreamWire.__struct_fields__ == DerenderChatStreamRequest.__struct_fields__
