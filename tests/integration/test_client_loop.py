"""The vLLM client loop against a real server: render, then the body is a valid GenerateRequest."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec
import pytest

from render_service import Renderer
from render_service.protocol.generate import GenerateRequest
from tests.integration.server import RunningServer, running_server

# SamplingParams' public fields and types (vLLM 0.33), which generate validates on input.
SAMPLING_FIELDS: dict[str, type | tuple[type, ...]] = {
    "n": int,
    "presence_penalty": float,
    "frequency_penalty": float,
    "repetition_penalty": float,
    "temperature": float,
    "top_p": float,
    "top_k": int,
    "min_p": float,
    "seed": int,
    "stop": list,
    "stop_token_ids": list,
    "ignore_eos": bool,
    "max_tokens": int,
    "min_tokens": int,
    "logprobs": int,
    "prompt_logprobs": int,
    "skip_special_tokens": bool,
    "spaces_between_special_tokens": bool,
    "include_stop_str_in_output": bool,
    "output_kind": int,
    "skip_clone": bool,
    "output_text_buffer_length": int,
    "structured_outputs": dict,
    "logit_bias": dict,
    "allowed_token_ids": list,
    "extra_args": dict,
    "bad_words": list,
    "skip_reading_prefix_cache": bool,
}


def assert_generate_request(body: dict[str, Any]) -> GenerateRequest:
    request = msgspec.convert(body, GenerateRequest)
    assert request.token_ids and all(isinstance(t, int) and t >= 0 for t in request.token_ids)
    for key, value in request.sampling_params.items():
        assert key in SAMPLING_FIELDS, key
        assert isinstance(value, SAMPLING_FIELDS[key]), (key, value)
    assert request.output_mode == "tokens"
    return request


def test_render_then_generate_body_is_valid(default_server: RunningServer) -> None:
    with default_server.client() as client:
        rendered = client.post(
            "/v1/chat/completions/render",
            json={
                "model": "default",
                "messages": [{"role": "user", "content": "Hello!"}],
                "max_tokens": 20,
            },
            headers={"X-Request-Id": "loop-1"},
        )
        assert rendered.status_code == 200
        body = rendered.json()
    request = assert_generate_request(body)
    assert request.request_id == "chatcmpl-loop-1"
    assert request.sampling_params["max_tokens"] == 20
    assert request.model == "default"


def test_http_and_library_give_the_same_request(
    default_server: RunningServer, default_model_dir: Path
) -> None:
    renderer = Renderer.from_pretrained(
        str(default_model_dir), served_model_name="default", max_model_len=256
    )
    chat = {
        "messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "2+2?"},
        ]
    }
    with default_server.client() as client:
        over_http = client.post(
            "/v1/chat/completions/render", json=chat, headers={"X-Request-Id": "same"}
        ).json()
    in_process = msgspec.to_builtins(renderer.render_chat(chat, request_id="same"))
    assert over_http == in_process


def test_models_health_version(default_server: RunningServer) -> None:
    with default_server.client() as client:
        assert client.get("/health").status_code == 200
        models = client.get("/v1/models").json()
        assert models["data"][0]["id"] == "default"
        assert models["data"][0]["max_model_len"] == 256
        assert "version" in client.get("/version").json()


def test_completions_tokenize_detokenize_round_trip(default_server: RunningServer) -> None:
    with default_server.client() as client:
        tokens = client.post("/tokenize", json={"prompt": "Hello, world! 你好"}).json()
        assert tokens["count"] == len(tokens["tokens"])
        text = client.post("/detokenize", json={"tokens": tokens["tokens"]}).json()["prompt"]
        assert text == "Hello, world! 你好"
        rendered = client.post(
            "/v1/completions/render", json={"prompt": ["a", "b"], "max_tokens": 5}
        ).json()
        assert [r["request_id"][-2:] for r in rendered] == ["-0", "-1"]
        assert (
            rendered[0]["token_ids"]
            == client.post("/tokenize", json={"prompt": "a"}).json()["tokens"]
        )


@pytest.fixture(scope="module")
def trusting_server(default_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Any:
    argv = [str(default_model_dir), "--trust-request-chat-template", "--api-key", "sekret"]
    with running_server(argv, tmp_path_factory.mktemp("trusting")) as server:
        yield server


def test_request_template_that_raises_is_a_400(trusting_server: RunningServer) -> None:
    auth = {"Authorization": "Bearer sekret"}
    with trusting_server.client(headers=auth) as client:
        bad = client.post(
            "/v1/chat/completions/render",
            json={
                "messages": [{"role": "user", "content": "x"}],
                "chat_template": "{{ raise_exception('nope') }}",
            },
        )
        assert bad.status_code == 400
        assert bad.json()["error"]["message"] == "nope"
        custom = client.post(
            "/v1/chat/completions/render",
            json={
                "messages": [{"role": "user", "content": "x"}],
                "chat_template": "U:{{ messages[0].content }}",
            },
        )
        assert custom.status_code == 200
        assert (
            client.post("/detokenize", json={"tokens": custom.json()["token_ids"]}).json()["prompt"]
            == "U:x"
        )


def test_api_key_guards_v1_like_vllm(trusting_server: RunningServer) -> None:
    with trusting_server.client() as client:
        denied = client.post(
            "/v1/chat/completions/render", json={"messages": [{"role": "user", "content": "x"}]}
        )
        assert denied.status_code == 401
        assert denied.json() == {"error": "Unauthorized"}
        assert client.get("/health").status_code == 200
        assert client.post("/tokenize", json={"prompt": "x"}).status_code == 200
