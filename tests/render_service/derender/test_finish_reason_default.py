"""A generate choice that leaves ``finish_reason`` out reads as vLLM 0.33 reads it, per message
type: a streaming event's choice defaults to null (the stream goes on), a non-streaming answer's
choice to "stop". Runs on the embedded default model (no ../shared)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from starlette.testclient import TestClient

from render_service import Renderer
from render_service.http.app import build_app
from render_service.model.default_model import ensure_default_model

CHAT = {"messages": [{"role": "user", "content": "Hi"}]}
IM_END = 151645


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> tuple[TestClient, list[int], list[int]]:
    model = ensure_default_model(Path(tmp_path_factory.mktemp("finish-model")))
    renderer = Renderer.from_pretrained(str(model), state_secret="s")
    prompt = renderer.render_chat(CHAT).token_ids
    output = renderer.model.backend.encode("Hello there", add_special_tokens=False).ids
    return TestClient(build_app(renderer)), prompt, output


def stream_call(client: TestClient, choice: dict[str, Any], state: Any, prompt: list[int]) -> Any:
    body = {
        "stream": True,
        "generate_chunk": {"request_id": "generate-tokens-f", "choices": [choice]},
        "stream_state": state,
    }
    if state is None:
        body |= {"prompt_token_ids": prompt, "chat_request": CHAT}
    answer = client.post("/v1/chat/completions/derender", json=body)
    assert answer.status_code == 200, answer.text
    return answer.json()


def test_streaming_choice_without_finish_reason_is_not_finished(setup: Any) -> None:
    client, prompt, output = setup
    first = stream_call(client, {"index": 0, "token_ids": output[:1]}, None, prompt)
    assert first["chunk"]["choices"][0]["finish_reason"] is None
    rest = stream_call(client, {"index": 0, "token_ids": output[1:]}, first["stream_state"], prompt)
    assert rest["chunk"]["choices"][0]["finish_reason"] is None
    last = stream_call(
        client,
        {"index": 0, "token_ids": [IM_END], "finish_reason": "stop"},
        rest["stream_state"],
        prompt,
    )
    assert last["chunk"]["choices"][0]["finish_reason"] == "stop"
    text = "".join(
        c["chunk"]["choices"][0]["delta"].get("content") or "" for c in (first, rest, last)
    )
    assert text == "Hello there"


def test_batch_choice_without_finish_reason_finished_with_stop(setup: Any) -> None:
    client, prompt, output = setup
    body = {
        "generate_response": {
            "request_id": "generate-tokens-b",
            "choices": [{"index": 0, "token_ids": [*output, IM_END]}],
        },
        "prompt_token_ids": prompt,
        "chat_request": CHAT,
    }
    answer = client.post("/v1/chat/completions/derender", json=body)
    assert answer.status_code == 200, answer.text
    choice = answer.json()["choices"][0]
    assert choice["finish_reason"] == "stop"
    assert choice["message"]["content"] == "Hello there"
