"""gpt-oss streams end to end: small signed state, any replica, same answer as batch.

Uses ../shared/models/gpt-oss (skips without it). The output is the bench's gpt-oss answer
(analysis, a send_email call, a final message), sent one id per call.
"""

from __future__ import annotations

import json
from functools import cache
from typing import Any

import pytest
from starlette.testclient import TestClient

from bench.harmony_bench import CHAT, gpt_oss_output
from render_service.http.app import build_app
from render_service.http.cli import parse_settings
from render_service.render import Renderer
from tests.golden import model_dir, needs_shared

pytestmark = needs_shared

ARGV = (
    "--served-model-name",
    "gpt-oss",
    "--enable-auto-tool-choice",
    "--tool-call-parser",
    "openai",
    "--system-start-date",
    "2026-01-01",
    "--state-secret",
    "shared-by-replicas",
)


@cache
def replicas() -> tuple[TestClient, TestClient]:
    """Two servers that share only the state secret."""
    argv = [str(model_dir("gpt-oss")), *ARGV]
    first, second = (
        TestClient(build_app(Renderer.from_settings(parse_settings(argv)))) for _ in range(2)
    )
    return first, second


def encode(text: str) -> list[int]:
    client = replicas()[0]
    response = client.post("/tokenize", json={"model": "gpt-oss", "prompt": text})
    return list(response.json()["tokens"])


@cache
def prompt() -> list[int]:
    response = replicas()[0].post("/v1/chat/completions/render", json={"model": "gpt-oss", **CHAT})
    return list(response.json()["token_ids"])


def chunk(ids: list[int], last: bool) -> dict[str, Any]:
    choice = {
        "index": 0,
        "finish_reason": "stop" if last else None,
        "stop_reason": None,
        "token_ids": ids,
        "logprobs": None,
    }
    return {"request_id": "gen-1", "usage": None, "output_mode": "tokens", "choices": [choice]}


def stream(ids: list[int]) -> tuple[dict[str, Any], int]:
    """Stream one id per call, alternating replicas; the accumulated message and the largest
    stream_state (bytes of its JSON)."""
    state: Any = None
    largest = 0
    message: dict[str, Any] = {"reasoning": "", "content": "", "calls": {}}
    for at, token in enumerate(ids):
        body = {
            "stream": True,
            "model": "gpt-oss",
            "prompt_tokens": len(prompt()),
            "prompt_token_ids": prompt(),
            "chat_request": {"model": "gpt-oss", **CHAT, "stream": True},
            "generate_chunk": chunk([token], at == len(ids) - 1),
            "stream_state": state,
        }
        response = replicas()[at % 2].post("/v1/chat/completions/derender", json=body)
        assert response.status_code == 200, response.text
        payload = response.json()
        state = payload["stream_state"]
        largest = max(largest, len(json.dumps(state)))
        for choice in payload["chunk"]["choices"]:
            delta = choice["delta"]
            message["reasoning"] += delta.get("reasoning") or ""
            message["content"] += delta.get("content") or ""
            for call in delta.get("tool_calls") or []:
                name, args = message["calls"].get(call["index"], ("", ""))
                function = call.get("function") or {}
                message["calls"][call["index"]] = (
                    name + (function.get("name") or ""),
                    args + (function.get("arguments") or ""),
                )
            if choice.get("finish_reason"):
                message["finish_reason"] = choice["finish_reason"]
    return message, largest


def batch(ids: list[int]) -> dict[str, Any]:
    response = {
        "request_id": "gen-1",
        "model": "gpt-oss",
        "created": 0,
        "usage": {
            "prompt_tokens": len(prompt()),
            "completion_tokens": len(ids),
            "total_tokens": len(prompt()) + len(ids),
        },
        "choices": [{**chunk(ids, True)["choices"][0]}],
    }
    body = {
        "model": "gpt-oss",
        "generate_response": response,
        "prompt_tokens": len(prompt()),
        "prompt_token_ids": prompt(),
        "chat_request": {"model": "gpt-oss", **CHAT},
    }
    got = replicas()[1].post("/v1/chat/completions/derender", json=body)
    assert got.status_code == 200, got.text
    choice = got.json()["choices"][0]
    message = choice["message"]
    return {
        "reasoning": message["reasoning"] or "",
        "content": message["content"] or "",
        "calls": {
            i: (c["function"]["name"], c["function"]["arguments"])
            for i, c in enumerate(message.get("tool_calls") or [])
        },
        "finish_reason": choice["finish_reason"],
    }


def test_an_answer_streams_across_replicas_like_batch_with_a_small_state() -> None:
    ids = gpt_oss_output(encode, 256)
    streamed, largest = stream(ids)
    assert streamed == batch(ids)
    assert streamed["calls"][0][0] == "send_email"
    assert streamed["finish_reason"] == "tool_calls"
    assert largest < 1024


@pytest.mark.parametrize(
    "text",
    [
        "<|channel|>commentary to=functions." + "x" * 400 + " <|constrain|>json<|message|>{}",
        "<|channel|>final<|message|>A<|return|> after return <|start|>assistant<|channel|>final"
        "<|message|>B",
        '<|channel|>commentary to=functions.send_email<|message|>{"to": []}<|call|> stray',
        "<|channel|>weird<|message|>hidden<|end|><|start|>assistant<|channel|>final<|message|>C",
        "<|channel|>final never closes",
    ],
    ids=["long-header", "return-in-the-middle", "after-call", "unknown-channel", "unclosed"],
)
def test_bad_harmony_gets_a_defined_answer(text: str) -> None:
    ids = encode(text)
    streamed, largest = stream(ids)
    assert streamed == batch(ids)
    assert largest < 1024
