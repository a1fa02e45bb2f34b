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
