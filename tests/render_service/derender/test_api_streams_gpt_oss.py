"""gpt-oss (Harmony) Messages and Responses derender: the official SDKs' accumulators agree with batch.

The server runs the `openai` tool parser (without one, Harmony tool calls vanish, as in vLLM's
chat). Each output is streamed at one token per chunk, whole, and at every two-chunk split,
alternating between two replicas that share the state secret.
"""

from __future__ import annotations

import contextlib
from functools import cache
from typing import Any

import pytest
from starlette.testclient import TestClient

from render_service.http.app import build_app
from render_service.http.cli import parse_settings
from render_service.render import Renderer
from tests.golden import MODELS, needs_shared
from tests.sdk_streams import anthropic_final, like, openai_final

pytestmark = needs_shared

WEATHER = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
REQUESTS = {
    "messages": {
        "model": "gpt-oss",
        "max_tokens": 512,
        "tools": [{"name": "get_weather", "input_schema": WEATHER}],
        "messages": [{"role": "user", "content": "Weather in Paris?"}],
    },
    "responses": {
        "model": "gpt-oss",
        "tools": [{"type": "function", "name": "get_weather", "parameters": WEATHER}],
        "input": "Weather in Paris?",
    },
}
OUTPUTS = {
    "call": (
        "<|channel|>analysis<|message|>Need the weather: one call.<|end|><|start|>assistant"
        "<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>"
        '{"city": "Paris"}<|call|>'
    ),
    "text": (
        "<|channel|>analysis<|message|>Say it is sunny.<|end|><|start|>assistant"
        "<|channel|>final<|message|>Sunny in Paris, ça va.<|return|>"
    ),
}


@cache
def replica(process: int) -> TestClient:
    """One server process (``process`` tells two with the same secret apart)."""
    flags = ["--enable-auto-tool-choice", "--tool-call-parser", "openai"]
    with contextlib.chdir(MODELS):
        renderer = Renderer.from_settings(
            parse_settings(
                ["gpt-oss", "--served-model-name", "gpt-oss", *flags, "--state-secret", "s"]
            )
        )
    return TestClient(build_app(renderer))


@cache
def prompt_and_output(api: str, output: str) -> tuple[list[int], list[int]]:
    client = replica(0)
    rendered = client.post(f"/v1/{api}/render", json=REQUESTS[api])
    assert rendered.status_code == 200, rendered.text
    tokenizer = client.app.state.service.renderer.model.hf_tokenizer  # type: ignore[attr-defined]
    return rendered.json()["token_ids"], tokenizer.encode(OUTPUTS[output], add_special_tokens=False)


def choice(ids: list[int], finish: str | None) -> dict[str, Any]:
    return {"request_id": "g", "choices": [{"index": 0, "finish_reason": finish, "token_ids": ids}]}


def batch(api: str, output: str) -> dict[str, Any]:
    prompt, ids = prompt_and_output(api, output)
    body = {
        "generate_response": choice(ids, "stop"),
        "prompt_token_ids": prompt,
        f"{api}_request": REQUESTS[api],
    }
    response = replica(0).post(f"/v1/{api}/derender", json=body)
    assert response.status_code == 200, response.text
    return response.json()  # type: ignore[no-any-return]


def streamed(api: str, output: str, sizes: list[int]) -> dict[str, Any]:
    """The answer the API's SDK accumulates from our events for chunks of ``sizes``."""
    prompt, ids = prompt_and_output(api, output)
    events: list[dict[str, Any]] = []
    state = None
    start = 0
    for number, size in enumerate(sizes):
        part = ids[start : start + size]
        start += size
        body: dict[str, Any] = {
            "stream": True,
            "generate_chunk": choice(part, "stop" if start == len(ids) else None),
            "stream_state": state,
        }
        if state is None:
            body.update({"prompt_token_ids": prompt, f"{api}_request": REQUESTS[api]})
        response = replica(number % 2).post(f"/v1/{api}/derender", json=body)
        assert response.status_code == 200, response.text
        events.extend(response.json()["events"])
        state = response.json()["stream_state"]
    assert start == len(ids)
    return anthropic_final(events) if api == "messages" else openai_final(events)


@pytest.mark.parametrize("output", sorted(OUTPUTS))
def test_the_outputs_have_reasoning_and_a_call_or_text(output: str) -> None:
    message = batch("messages", output)
    kinds = ["thinking", "tool_use"] if output == "call" else ["thinking", "text"]
    assert [block["type"] for block in message["content"]] == kinds
    response = batch("responses", output)
    kinds = ["reasoning", "function_call"] if output == "call" else ["reasoning", "message"]
    assert [item["type"] for item in response["output"]] == kinds
    if output == "call":
        assert message["content"][1]["input"] == {"city": "Paris"}
        assert message["stop_reason"] == "tool_use"
        assert response["output"][1]["arguments"] == '{"city": "Paris"}'


@pytest.mark.parametrize("output", sorted(OUTPUTS))
@pytest.mark.parametrize("api", ["messages", "responses"])
def test_every_chunking_accumulates_to_the_batch_answer(api: str, output: str) -> None:
    want = batch(api, output)
    want.pop("created_at", None)
    n = len(prompt_and_output(api, output)[1])
    for sizes in [[1] * n, [n], *([cut, n - cut] for cut in range(1, n))]:
        assert like(streamed(api, output, sizes), want) == want, sizes
