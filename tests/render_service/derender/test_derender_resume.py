"""A client that carries vLLM's own stream state (all output ids so far) resumes correctly.

The server answers from the longest output prefix in its parser cache and replays only the
rest; on a miss it replays everything. Either way the next chunk equals an uninterrupted stream.
Runs on the embedded default model (no ../shared).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from starlette.testclient import TestClient

from render_service import Renderer
from render_service.http.app import build_app
from render_service.model.default_model import ensure_default_model

CHAT = {"messages": [{"role": "user", "content": "Say hello in three languages."}]}
TEXT = "Hello! Bonjour! Hola! ¿Qué tal? 你好，世界。<|im_end|>"


@pytest.fixture(scope="module")
def setup(
    tmp_path_factory: pytest.TempPathFactory,
) -> tuple[TestClient, Renderer, list[int], list[int]]:
    model = ensure_default_model(Path(tmp_path_factory.mktemp("resume-model")))
    renderer = Renderer.from_pretrained(str(model), state_secret="s")
    client = TestClient(build_app(renderer))
    prompt = renderer.render_chat(CHAT).token_ids
    output = renderer.model.backend.encode(TEXT, add_special_tokens=False).ids
    return client, renderer, prompt, output


def chunk(ids: list[int], last: bool, request_id: str = "generate-tokens-r") -> dict[str, Any]:
    return {
        "request_id": request_id,
        "choices": [{"index": 0, "finish_reason": "stop" if last else None, "token_ids": ids}],
    }


def deltas(
    client: TestClient, prompt: list[int], output: list[int], state: Any = None, start: int = 0
) -> list[Any]:
    out = []
    for i in range(start, len(output)):
        body = {
            "stream": True,
            "generate_chunk": chunk(output[i : i + 1], i == len(output) - 1),
            "stream_state": state,
            "prompt_token_ids": prompt,
            "chat_request": CHAT,
        }
        payload = client.post("/v1/chat/completions/derender", json=body).json()
        state = payload["stream_state"]
        out.append(payload["chunk"]["choices"][0]["delta"]["content"])
    return out


def vllm_state(history: list[int]) -> dict[str, Any]:
    return {"role_sent": True, "output_token_ids": history, "output_chunk_lens": [1] * len(history)}


def test_resume_from_cache_and_from_scratch_equal_an_uninterrupted_stream(setup: Any) -> None:
    client, _, prompt, output = setup
    stats = client.app.state.service.derenderer.cache
    whole = deltas(client, prompt, output)
    cut = len(output) // 2
    before = stats.stats()
    deltas(client, prompt, output[:cut])  # leaves the states of this stream in the cache
    resumed = deltas(client, prompt, output, state=vllm_state(output[:cut]), start=cut)
    assert resumed == whole[cut:]
    assert stats.stats().hits > before.hits
    cold = deltas(client, prompt, output, state=vllm_state(output[:cut]), start=cut)
    assert cold == whole[cut:]


def test_vllm_state_whose_lengths_do_not_add_up_is_a_400(setup: Any) -> None:
    client, _, prompt, output = setup
    body = {
        "stream": True,
        "generate_chunk": chunk(output[:1], False),
        "stream_state": {"output_token_ids": [1, 2], "output_chunk_lens": [3]},
        "prompt_token_ids": prompt,
        "chat_request": CHAT,
    }
    response = client.post("/v1/chat/completions/derender", json=body)
    assert response.status_code == 400
    assert response.json()["error"]["type"] == "Bad Request"
