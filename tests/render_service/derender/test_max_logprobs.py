"""--max-logprobs bounds the candidates per position that batch derender accepts, with vLLM's
message (its _validate_derender_bounds); -1 lifts the bound. Runs on the embedded default model."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from starlette.testclient import TestClient

from render_service import Renderer
from render_service.http.app import build_app
from render_service.model.default_model import ensure_default_model


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return ensure_default_model(tmp_path_factory.mktemp("model"))


def client(model_dir: Path, max_logprobs: int) -> TestClient:
    return TestClient(
        build_app(Renderer.from_pretrained(str(model_dir), max_logprobs=max_logprobs))
    )


def body(candidates: int) -> dict[str, Any]:
    position = {
        "token_id": 9707,
        "logprob": -0.1,
        "top_logprobs": [{"token_id": i, "logprob": -1.0} for i in range(candidates)],
    }
    choice = {"index": 0, "token_ids": [9707], "logprobs": {"content": [position]}}
    return {"generate_response": {"request_id": "r", "choices": [choice]}}


@pytest.mark.parametrize("path", ["/v1/chat/completions/derender", "/v1/completions/derender"])
def test_more_candidates_than_max_logprobs_is_vllms_400(model_dir: Path, path: str) -> None:
    test_client = client(model_dir, 3)
    payload = body(3)
    if path == "/v1/completions/derender":
        payload = {"generate_responses": [payload["generate_response"]]}
    assert test_client.post(path, json=payload).status_code == 200
    payload = body(4)
    if path == "/v1/completions/derender":
        payload = {"generate_responses": [payload["generate_response"]]}
    response = test_client.post(path, json=payload)
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["message"] == "top_logprobs count (4) in choice 0 exceeds max_logprobs (3)."
    assert error["type"] == "BadRequestError"


def test_minus_one_lifts_the_bound(model_dir: Path) -> None:
    response = client(model_dir, -1).post("/v1/chat/completions/derender", json=body(50))
    assert response.status_code == 200


# Regression (issue 14): streaming derender accepted any number of candidates per position
# (1000 x 1000: seconds of CPU and +150 MB), and nothing bounded the number of choices.
def stream_chunk(candidates: int, positions: int = 1) -> dict[str, Any]:
    position = {
        "token_id": 9707,
        "logprob": -0.1,
        "top_logprobs": [{"token_id": i, "logprob": -1.0} for i in range(candidates)],
    }
    choice = {
        "index": 0,
        "token_ids": [9707] * positions,
        "logprobs": {"content": [position] * positions},
        "finish_reason": None,
    }
    return {"request_id": "r", "choices": [choice]}


@pytest.mark.parametrize(
    "path,field",
    [
        ("/v1/chat/completions/derender", "generate_chunk"),
        ("/v1/chat/completions/derender", "generate_chunks"),
        ("/v1/completions/derender", "generate_chunk"),
    ],
)
def test_streaming_refuses_more_candidates_than_max_logprobs(
    model_dir: Path, path: str, field: str
) -> None:
    test_client = client(model_dir, 3)
    for candidates, status in ((3, 200), (4, 400)):
        chunk = stream_chunk(candidates)
        payload = {"stream": True, field: [chunk] if field == "generate_chunks" else chunk}
        response = test_client.post(path, json=payload)
        assert response.status_code == status, response.text
    message = response.json()["error"]["message"]
    assert message == "top_logprobs count (4) in choice 0 exceeds max_logprobs (3)."


def test_streaming_refuses_more_logprob_positions_than_the_context(model_dir: Path) -> None:
    test_client = client(model_dir, 3)
    limit = test_client.get("/v1/models").json()["data"][0]["max_model_len"]
    chunk = stream_chunk(1, positions=1)
    chunk["choices"][0]["logprobs"]["content"] *= limit + 1
    response = test_client.post(
        "/v1/chat/completions/derender", json={"stream": True, "generate_chunk": chunk}
    )
    assert response.status_code == 400
    assert response.json()["error"]["message"] == (
        f"logprobs.content length ({limit + 1}) in choice 0 exceeds max_model_len ({limit})."
    )


def test_more_choices_than_vllms_limit_is_its_400(model_dir: Path) -> None:
    test_client = TestClient(build_app(Renderer.from_pretrained(str(model_dir), max_n_sequences=2)))
    choices = [{"index": i, "token_ids": [9707]} for i in range(3)]
    response = test_client.post(
        "/v1/chat/completions/derender",
        json={"generate_response": {"request_id": "r", "choices": choices}},
    )
    assert response.status_code == 400
    assert response.json()["error"]["message"] == (
        "choices count (3) in response 'r' exceeds server maximum (2)."
    )
    responses = [{"request_id": f"r{i}", "choices": choices[:1]} for i in range(3)]
    response = test_client.post("/v1/completions/derender", json={"generate_responses": responses})
    assert response.status_code == 400
    assert response.json()["error"]["message"] == (
        "generate_responses count (3) exceeds server maximum (2). "
        "Set VLLM_MAX_N_SEQUENCES to increase this limit."
    )


@pytest.mark.parametrize("path", ["/v1/chat/completions/render", "/v1/completions/render"])
def test_n_over_vllms_limit_is_its_400(model_dir: Path, path: str) -> None:
    test_client = client(model_dir, 20)
    body: dict[str, Any] = {"n": 16385, "max_tokens": 4}
    if "chat" in path:
        body["messages"] = [{"role": "user", "content": "hi"}]
    else:
        body["prompt"] = "hi"
    response = test_client.post(path, json=body)
    assert response.status_code == 400
    assert response.json()["error"]["message"] == (
        "n must be at most 16384, got 16385. To increase this limit, set the "
        "VLLM_MAX_N_SEQUENCES environment variable. (parameter=n, value=16385)"
    )
    body["n"] = 16384
    assert test_client.post(path, json=body).status_code == 200
