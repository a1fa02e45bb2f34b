"""In-process derender (``Renderer.derender_chat``, ``Renderer.chat_stream``) answers exactly what
the HTTP derender answers, for every golden chat derender case and every stored chunking.

The HTTP side is our own server (tests/render_service/derender/test_golden_derender.py holds it
to vLLM's answers); here the library must equal it field for field, tool-call ids aside (random
per call). Golden bodies the library cannot express are listed with the reason: they are wire
errors (no generate response, no choice, ids that are not a list, a text output mode) or a
served-model-name mismatch, which a library
call, bound to its one model, never has.
"""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path
from typing import Any

import msgspec
import pytest
from starlette.testclient import TestClient

from render_service.errors import RenderServiceError
from render_service.http.app import build_app
from render_service.http.cli import parse_settings
from render_service.library import Renderer
from tests.golden import case_params, load_case, needs_shared, server_argv
from tests.render_service.derender import test_golden_derender as golden_derender

pytestmark = needs_shared

# The configurations whose derender the service supports (held to vLLM's answers there).
CHAT_DIRECTORIES = golden_derender.DIRECTORIES


@lru_cache(maxsize=2)  # a renderer per model held for the whole run exhausts memory
def renderer_for(argv: tuple[str, ...]) -> Renderer:
    return Renderer.from_settings(parse_settings(list(argv)))


@lru_cache(maxsize=2)  # a renderer per model held for the whole run exhausts memory
def client_for(argv: tuple[str, ...]) -> TestClient:
    return TestClient(build_app(renderer_for(argv)))


def http(case: dict[str, Any], path: str, body: dict[str, Any]) -> Any:
    client = client_for(tuple(server_argv(case)))
    content = json.dumps(body, ensure_ascii=False).encode()
    return client.post(path, content=content, headers={"Content-Type": "application/json"})


def without_call_ids(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: without_call_ids(v) for k, v in value.items() if k not in ("id", "created")}
    if isinstance(value, list):
        return [without_call_ids(v) for v in value]
    return value


def library_form(case: dict[str, Any]) -> str | None:
    """Why a golden body has no library call, or None when it has one."""
    request = case["request"]
    response = request.get("generate_response")
    if not isinstance(response, dict) or not response.get("choices"):
        return "a wire error: no generate response or no choice"
    if request.get("model") not in (None, case["model"]):
        return "a served-model-name mismatch (a library renderer has one model)"
    if any(not isinstance(c.get("token_ids"), list) for c in response["choices"]):
        return "a wire error: token_ids is not a list"
    if response.get("output_mode", "tokens") != "tokens":
        return "a wire error: output_mode is not 'tokens' (the library takes ids)"
    return None


def chat_cases() -> list[Any]:
    params = []
    for param in case_params(CHAT_DIRECTORIES, "derender"):
        _, path = param.values
        case = load_case(path)
        if case.get("kind") == "completion":
            continue
        reason = library_form(case)
        marks = [pytest.mark.skip(reason=reason)] if reason else []
        params.append(pytest.param(*param.values, id=param.id, marks=marks))
    return params


@pytest.mark.parametrize(("directory", "path"), chat_cases())
def test_library_derender_equals_http(directory: str, path: Path) -> None:
    case = load_case(path)
    argv = tuple(server_argv(case))
    renderer = renderer_for(argv)
    body = case["request"]
    answer = http(case, case["path"], body)
    response = body["generate_response"]
    got: list[Any] = []
    error: RenderServiceError | None = None
    try:
        for choice in response["choices"]:
            result = renderer.derender_chat(
                body.get("prompt_token_ids") or [],
                choice["token_ids"],
                body.get("chat_request"),
                finish_reason=choice.get("finish_reason", "stop"),
                stop_reason=choice.get("stop_reason"),
                logprobs=choice.get("logprobs"),
                index=choice.get("index", 0),
            )
            got.append(msgspec.to_builtins(result))
    except RenderServiceError as exc:
        error = exc
    if answer.status_code != 200:
        assert error is not None, answer.text
        assert error.status == answer.status_code
        return
    assert error is None, answer.text
    assert without_call_ids(got) == without_call_ids(answer.json()["choices"])


def stream_cases() -> list[Any]:
    params = []
    for param in chat_cases():
        directory, path = param.values
        case = load_case(path)
        if param.marks:
            continue
        for chunking in (case.get("stream") or {}).get("chunkings", {}):
            params.append(
                pytest.param(directory, path, chunking, id=f"{directory}/{path.stem}/{chunking}")
            )
    return params


@pytest.mark.parametrize(("directory", "path", "chunking"), stream_cases())
def test_chat_stream_equals_http_stream(directory: str, path: Path, chunking: str) -> None:
    case = load_case(path)
    renderer = renderer_for(tuple(server_argv(case)))
    stream_def = case["stream"]
    base = stream_def["request_base"]
    stream = renderer.chat_stream(base.get("chat_request"), base.get("prompt_token_ids"))
    state: Any = None
    for call in stream_def["chunkings"][chunking]["calls"]:
        chunk = call["generate_chunk"]
        answer = http(
            case, stream_def["path"], {**base, "generate_chunk": chunk, "stream_state": state}
        )
        if not chunk.get("choices") or answer.status_code != 200:
            return  # an empty chunk or an error ends the comparison: the library feeds choices
        payload = answer.json()
        state = payload["stream_state"]
        choice = chunk["choices"][0]
        got = stream.feed(
            choice["token_ids"] or [],
            finish_reason=choice.get("finish_reason"),
            stop_reason=choice.get("stop_reason"),
            logprobs=choice.get("logprobs"),
        )
        expected = payload["chunk"]["choices"][0]
        assert without_call_ids(msgspec.to_builtins(got)) == without_call_ids(expected)
    assert isinstance(stream.state, str)
