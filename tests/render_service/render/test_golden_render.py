"""Render, tokenize and detokenize answers equal vLLM 0.33.0's for the golden corpus."""

from __future__ import annotations

import base64
import contextlib
import copy
from functools import cache
from pathlib import Path
from typing import Any

import pytest
from starlette.testclient import TestClient

from render_service.http.app import build_app
from render_service.http.cli import parse_settings
from render_service.render import Renderer
from tests.golden import case_params, load_case, needs_shared, server_argv

pytestmark = needs_shared

DIRECTORIES = [
    "qwen3",
    "qwen3-noparser",
    "qwen2.5-instruct",
    "deepseek-r1-distill-qwen",
    "llama-3.1-instruct",
    "qwen2.5-vl",
    "deepseek-v3.1",
    "qwen3-coder",
    "gpt-oss",
    "gpt-oss-openai-tools",
    "gemma-3-it",
    "mistral",
]


#: Cases where vLLM answers 500 to bad input and we answer 400 (docs/compat.md).
CLIENT_ERRORS_FOR_500 = {
    ("mistral", "detokenize_out_of_vocab"),  # tekken: "Invalid token for decoding"
    ("mistral", "detokenize_special"),
}


@cache
def client_for(argv: tuple[str, ...]) -> TestClient:
    # vLLM ran inside the models folder with the bare directory name as the model, and that
    # name is part of every image hash, so load the model the same way.
    model = Path(argv[0])
    with contextlib.chdir(model.parent):
        renderer = Renderer.from_settings(parse_settings([model.name, *argv[1:]]))
    return TestClient(build_app(renderer))


def send(case: dict[str, Any]) -> Any:
    client = client_for(tuple(server_argv(case)))
    if case.get("request_body_base64") is not None:
        content = base64.b64decode(case["request_body_base64"])
    elif case["request"] is None:
        content = b""
    else:
        import json

        content = json.dumps(case["request"], ensure_ascii=False).encode()
    return client.request(case["method"], case["path"], content=content, headers=case["headers"])


def strip_random(body: Any, case: dict[str, Any]) -> Any:
    """Drop fields vLLM fills at random (request ids without a caller-given id)."""
    random_paths = set(case.get("nondeterministic_fields", []))
    items = body if isinstance(body, list) else [body]
    for index, item in enumerate(items):
        if not isinstance(item, dict):
            continue
        prefix = f"$.response[{index}]" if isinstance(body, list) else "$.response"
        if f"{prefix}.request_id" in random_paths:
            item.pop("request_id", None)
    return body


@pytest.mark.parametrize(("directory", "path"), case_params(DIRECTORIES, "render"))
def test_render_matches_vllm(directory: str, path: Path) -> None:
    case = load_case(path)
    response = send(case)
    expected = case["response"]
    if (directory, case["name"]) in CLIENT_ERRORS_FOR_500:
        # vLLM crashes (500); bad input gets a 400 here (docs/compat.md).
        assert case["status"] == 500 and response.status_code == 400, response.text
        assert response.json()["error"]["type"] == "BadRequestError"
        return
    assert response.status_code == case["status"], response.text
    got = response.json()
    if case["status"] != 200:
        if isinstance(expected, dict) and "error" in expected:
            assert got["error"]["type"] == expected["error"]["type"]
            assert got["error"]["code"] == expected["error"]["code"]
        else:
            assert got == expected
        return
    got = strip_random(got, case)
    expected = strip_random(copy.deepcopy(expected), case)
    assert got == expected
