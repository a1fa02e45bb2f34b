"""Messages and Responses derender: the official SDKs' stream accumulators agree with batch.

Each stream is derendered chunk by chunk over HTTP, alternating between two replicas that share
only the state secret, with the lean protocol (prompt ids and the API request on the first call
only). Its events, as SSE, go through ``anthropic``'s and ``openai``'s own stream helpers
(offline, over an httpx mock transport); the message each SDK assembles must equal our batch
derender of the same output, at every chunking.
"""

from __future__ import annotations

import contextlib
from functools import cache
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from starlette.testclient import TestClient

from render_service.http.app import build_app
from render_service.http.cli import parse_settings
from render_service.render import Renderer
from tests.golden import MODELS, needs_shared
from tests.sdk_streams import anthropic_final, like, openai_final

pytestmark = needs_shared

FLAGS = ["--reasoning-parser", "qwen3", "--enable-auto-tool-choice", "--tool-call-parser", "hermes"]
WEATHER = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
MESSAGES_REQUEST = {
    "model": "qwen3",
    "max_tokens": 512,
    "tools": [{"name": "get_weather", "description": "Weather now.", "input_schema": WEATHER}],
    "messages": [{"role": "user", "content": "Weather in Paris and in Rome?"}],
}
RESPONSES_REQUEST = {
    "model": "qwen3",
    "instructions": "Be brief.",
    "tools": [{"type": "function", "name": "get_weather", "parameters": WEATHER}],
    "input": [{"role": "user", "content": "Weather in Paris and in Rome?"}],
}
OUTPUT = (
    "<think>\nTwo cities, so two calls: Paris and Rome. Ça va.\n</think>\n\n"
    "Let me check both.<tool_call>\n"
    '{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n<tool_call>\n'
    '{"name": "get_weather", "arguments": {"city": "Rome"}}\n</tool_call><|im_end|>'
)
REQUEST_ID = "generate-tokens-golden"


@cache
def replica(secret: str = "shared-test-secret", process: int = 0) -> TestClient:
    """One server process's worth of state (``process`` tells two with the same secret apart)."""
    with contextlib.chdir(MODELS):
        renderer = Renderer.from_settings(
            parse_settings(
                ["qwen3", "--served-model-name", "qwen3", *FLAGS, "--state-secret", secret]
            )
        )
    return TestClient(build_app(renderer))


@cache
def prompt_and_output(api: str) -> tuple[list[int], list[int]]:
    client = replica()
    if api == "messages":
        rendered = client.post("/v1/messages/render", json=MESSAGES_REQUEST)
    else:
        rendered = client.post("/v1/responses/render", json=RESPONSES_REQUEST)
    assert rendered.status_code == 200, rendered.text
    tokenizer = client.app.state.service.renderer.model.hf_tokenizer  # type: ignore[attr-defined]
    return rendered.json()["token_ids"], tokenizer.encode(OUTPUT, add_special_tokens=False)


def api_request(api: str) -> tuple[str, dict[str, Any]]:
    if api == "messages":
        return "messages_request", MESSAGES_REQUEST
    return "responses_request", RESPONSES_REQUEST


def batch(api: str) -> dict[str, Any]:
    prompt, ids = prompt_and_output(api)
    field, request = api_request(api)
    body = {
        "generate_response": {
            "request_id": REQUEST_ID,
            "choices": [{"index": 0, "finish_reason": "stop", "token_ids": ids}],
        },
        "prompt_token_ids": prompt,
        field: request,
    }
    response = replica().post(f"/v1/{api}/derender", json=body)
    assert response.status_code == 200, response.text
    return response.json()  # type: ignore[no-any-return]


def stream_events(api: str, sizes: list[int]) -> list[dict[str, Any]]:
    """Derender the output in chunks of ``sizes``, alternating replicas; all events in order."""
    prompt, ids = prompt_and_output(api)
    field, request = api_request(api)
    clients = [replica(process=0), replica(process=1)]
    events: list[dict[str, Any]] = []
    state = None
    start = 0
    chunks = []
    for size in sizes:
        chunks.append(ids[start : start + size])
        start += size
    assert start == len(ids)
    for number, part in enumerate(chunks):
        last = number == len(chunks) - 1
        chunk = {
            "request_id": REQUEST_ID,
            "choices": [{"index": 0, "finish_reason": "stop" if last else None, "token_ids": part}],
        }
        body: dict[str, Any] = {"stream": True, "generate_chunk": chunk, "stream_state": state}
        if state is None:
            body.update({"prompt_token_ids": prompt, field: request})
        response = clients[number % 2].post(f"/v1/{api}/derender", json=body)
        assert response.status_code == 200, response.text
        answer = response.json()
        events.extend(answer["events"])
        state = answer["stream_state"]
    # The engine's closing usage-only chunk adds nothing once the message is finished.
    usage_only = {"request_id": REQUEST_ID, "choices": [], "usage": {"prompt_tokens": len(prompt)}}
    tail = replica().post(
        f"/v1/{api}/derender",
        json={"stream": True, "generate_chunk": usage_only, "stream_state": state},
    )
    assert tail.status_code == 200, tail.text
    assert tail.json()["events"] == []
    return events


def check_messages(sizes: list[int]) -> None:
    want = batch("messages")
    got = anthropic_final(stream_events("messages", sizes))
    assert like(got, want) == want


def check_responses(sizes: list[int]) -> None:
    want = batch("responses")
    want.pop("created_at")
    got = openai_final(stream_events("responses", sizes))
    assert like(got, want) == want


def _one_token() -> list[int]:
    return [1] * len(prompt_and_output("messages")[1])


def test_the_output_has_reasoning_text_and_two_calls() -> None:
    message = batch("messages")
    assert [b["type"] for b in message["content"]] == ["thinking", "text", "tool_use", "tool_use"]
    assert [b["input"] for b in message["content"][2:]] == [{"city": "Paris"}, {"city": "Rome"}]
    assert message["stop_reason"] == "tool_use"
    response = batch("responses")
    kinds = [item["type"] for item in response["output"]]
    assert kinds == ["reasoning", "message", "function_call", "function_call"]
    assert response["status"] == "completed"
    assert response["instructions"] == "Be brief."
    # vLLM's count: the tokens between <think> and </think>.
    _, ids = prompt_and_output("responses")
    tokenizer = replica().app.state.service.renderer.model.hf_tokenizer  # type: ignore[attr-defined]
    start, end = (
        ids.index(tokenizer.convert_tokens_to_ids("<think>")),
        ids.index(tokenizer.convert_tokens_to_ids("</think>")),
    )
    assert response["usage"]["output_tokens_details"]["reasoning_tokens"] == end - start - 1


@pytest.mark.parametrize("api", ["messages", "responses"])
def test_one_token_and_whole_streams_accumulate_to_the_batch_answer(api: str) -> None:
    check = check_messages if api == "messages" else check_responses
    n = len(prompt_and_output(api)[1])
    check([1] * n)
    check([n])


@pytest.mark.parametrize("api", ["messages", "responses"])
def test_every_two_chunk_split_accumulates_to_the_batch_answer(api: str) -> None:
    check = check_messages if api == "messages" else check_responses
    n = len(prompt_and_output(api)[1])
    for cut in range(1, n):
        check([cut, n - cut])


@settings(max_examples=25, deadline=None)
@given(data=st.data())
def test_random_chunkings_accumulate_to_the_batch_answer(data: st.DataObject) -> None:
    n = len(prompt_and_output("messages")[1])
    sizes = []
    left = n
    while left:
        size = data.draw(st.integers(1, min(left, 6)))
        sizes.append(size)
        left -= size
    check_messages(sizes)
    check_responses(sizes)


def test_a_state_from_a_replica_with_another_secret_is_refused() -> None:
    prompt, ids = prompt_and_output("messages")
    chunk = {
        "request_id": REQUEST_ID,
        "choices": [{"index": 0, "finish_reason": None, "token_ids": ids[:3]}],
    }
    first = replica().post(
        "/v1/messages/derender",
        json={
            "stream": True,
            "generate_chunk": chunk,
            "prompt_token_ids": prompt,
            "messages_request": MESSAGES_REQUEST,
        },
    )
    state = first.json()["stream_state"]
    chunk["choices"][0]["token_ids"] = ids[3:6]  # type: ignore[index]
    other = replica("another-secret").post(
        "/v1/messages/derender",
        json={"stream": True, "generate_chunk": chunk, "stream_state": state},
    )
    assert other.status_code == 400
    assert other.json()["error"]["param"] == "stream_state"
    # The API part is bound to the chat part: a state spliced from two streams fails too.
    chat, _, api = state.rpartition("~")
    spliced = replica().post(
        "/v1/messages/derender",
        json={"stream": True, "generate_chunk": chunk, "stream_state": f"{chat}x~{api}"},
    )
    assert spliced.status_code == 400
    assert spliced.json()["error"]["param"] == "stream_state"


@pytest.mark.parametrize("api", ["messages", "responses"])
def test_the_first_call_needs_the_api_request(api: str) -> None:
    prompt, ids = prompt_and_output(api)
    chunk = {
        "request_id": REQUEST_ID,
        "choices": [{"index": 0, "finish_reason": None, "token_ids": ids[:2]}],
    }
    response = replica().post(
        f"/v1/{api}/derender",
        json={"stream": True, "generate_chunk": chunk, "prompt_token_ids": prompt},
    )
    assert response.status_code == 400
    assert f"{api}_request" in response.json()["error"]["message"]


def test_a_cut_off_message_reports_max_tokens_and_an_incomplete_response() -> None:
    _, ids = prompt_and_output("messages")
    prompt = prompt_and_output("messages")[0]
    cut = ids[:20]
    body = {
        "generate_response": {
            "request_id": REQUEST_ID,
            "choices": [{"index": 0, "finish_reason": "length", "token_ids": cut}],
        },
        "prompt_token_ids": prompt,
        "messages_request": MESSAGES_REQUEST,
    }
    message = replica().post("/v1/messages/derender", json=body).json()
    assert message["stop_reason"] == "max_tokens"
    body["responses_request"] = RESPONSES_REQUEST
    del body["messages_request"]
    body["prompt_token_ids"] = prompt_and_output("responses")[0]
    response = replica().post("/v1/responses/derender", json=body).json()
    assert response["status"] == "incomplete"
    assert response["incomplete_details"] == {"reason": "max_output_tokens"}
    assert response["output"][-1]["status"] == "incomplete"
