"""Streams move between replicas; forged, foreign or oversized states get a 400; lean chunks work.

Runs on the embedded default model (Qwen2.5's tokenizer, hermes tool calls), so no ../shared.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from render_service import Renderer
from tests.integration.server import RunningServer, running_server

SECRET = "test-secret-shared-by-replicas-0123456789"
FLAGS = ["--enable-auto-tool-choice", "--tool-call-parser", "hermes", "--state-secret", SECRET]
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        },
    }
]
CHAT = {"messages": [{"role": "user", "content": "Weather in Paris?"}], "tools": TOOLS}
OUTPUT_TEXT = 'Let me check. <tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris 🌧"}}\n</tool_call><|im_end|>'
PATH = "/v1/chat/completions/derender"


@pytest.fixture(scope="module")
def replicas(
    default_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[list[RunningServer]]:
    argv = [str(default_model_dir), "--served-model-name", "default", *FLAGS]
    with (
        running_server(argv, tmp_path_factory.mktemp("a")) as first,
        running_server(argv, tmp_path_factory.mktemp("b")) as second,
    ):
        yield [first, second]


@pytest.fixture(scope="module")
def prompt_and_output(default_model_dir: Path) -> tuple[list[int], list[int]]:
    renderer = Renderer.from_pretrained(
        str(default_model_dir), enable_auto_tool_choice=True, tool_call_parser="hermes"
    )
    prompt = renderer.render_chat(CHAT).token_ids
    output = renderer.model.backend.encode(OUTPUT_TEXT, add_special_tokens=False).ids
    return prompt, output


def generate_chunk(request_id: str, ids: list[int], last: bool) -> dict[str, Any]:
    return {
        "request_id": request_id,
        "usage": None,
        "output_mode": "tokens",
        "choices": [
            {
                "index": 0,
                "finish_reason": "stop" if last else None,
                "stop_reason": None,
                "token_ids": ids,
                "logprobs": None,
            }
        ],
    }


def run_stream(
    servers: list[RunningServer],
    prompt: list[int],
    output: list[int],
    *,
    request_id: str = "generate-tokens-chatcmpl-1",
    lean: bool = False,
) -> tuple[dict[str, Any], list[int]]:
    """The vLLM client loop, one token per chunk, chunk i sent to servers[i % len(servers)]."""
    state: Any = None
    reasoning, content, calls = [], [], {}
    sizes = []
    finish = None
    for i, token in enumerate(output):
        body: dict[str, Any] = {
            "stream": True,
            "generate_chunk": generate_chunk(request_id, [token], i == len(output) - 1),
            "stream_state": state,
        }
        if not lean or state is None:
            body["prompt_token_ids"] = prompt
            body["chat_request"] = {**CHAT, "stream": True}
        data = json.dumps(body).encode()
        sizes.append(len(data))
        response = httpx.post(
            servers[i % len(servers)].url + PATH,
            content=data,
            headers={"Content-Type": "application/json"},
            timeout=30,
        )
        assert response.status_code == 200, response.text
        payload = response.json()
        state = payload["stream_state"]
        choice = payload["chunk"]["choices"][0]
        delta = choice["delta"]
        if delta.get("content") is not None:
            content.append(delta["content"])
        if delta.get("reasoning") is not None:
            reasoning.append(delta["reasoning"])
        for call in delta.get("tool_calls") or []:
            entry = calls.setdefault(call["index"], {"id": None, "name": "", "arguments": ""})
            entry["id"] = entry["id"] or call.get("id")
            entry["name"] += call["function"].get("name") or ""
            entry["arguments"] += call["function"].get("arguments") or ""
        finish = choice["finish_reason"] or finish
    result = {"content": "".join(content), "tool_calls": calls, "finish_reason": finish}
    return result, sizes


def test_each_chunk_on_another_replica_equals_one_replica(
    replicas: list[RunningServer], prompt_and_output: tuple[list[int], list[int]]
) -> None:
    prompt, output = prompt_and_output
    alone, _ = run_stream(replicas[:1], prompt, output)
    alternating, _ = run_stream(replicas, prompt, output)
    assert alternating == alone
    assert alone["content"] == "Let me check. "
    assert alone["tool_calls"][0]["name"] == "get_weather"
    assert json.loads(alone["tool_calls"][0]["arguments"]) == {"city": "Paris 🌧"}
    assert alone["finish_reason"] == "tool_calls"


def test_streaming_agrees_with_batch(
    replicas: list[RunningServer], prompt_and_output: tuple[list[int], list[int]]
) -> None:
    prompt, output = prompt_and_output
    streamed, _ = run_stream(replicas, prompt, output)
    response = {
        "request_id": "generate-tokens-chatcmpl-1",
        "choices": [{"index": 0, "finish_reason": "stop", "token_ids": output}],
    }
    batch = httpx.post(
        replicas[0].url + PATH,
        json={"generate_response": response, "prompt_token_ids": prompt, "chat_request": CHAT},
        timeout=30,
    ).json()
    message = batch["choices"][0]["message"]
    assert message["content"] == streamed["content"]
    call = message["tool_calls"][0]
    assert (call["id"], call["function"]["name"], call["function"]["arguments"]) == (
        streamed["tool_calls"][0]["id"],
        streamed["tool_calls"][0]["name"],
        streamed["tool_calls"][0]["arguments"],
    )


def test_lean_chunks_are_small_and_give_the_same_result(
    replicas: list[RunningServer], prompt_and_output: tuple[list[int], list[int]]
) -> None:
    prompt, output = prompt_and_output
    full, _ = run_stream(replicas, prompt, output)
    lean, sizes = run_stream(replicas, prompt, output, lean=True)
    assert lean == full
    assert max(sizes[1:]) < 2048


def first_state(
    server: RunningServer, prompt: list[int], output: list[int], request_id: str
) -> str:
    body = {
        "stream": True,
        "generate_chunk": generate_chunk(request_id, output[:1], False),
        "prompt_token_ids": prompt,
        "chat_request": CHAT,
    }
    response = httpx.post(server.url + PATH, json=body, timeout=30)
    assert response.status_code == 200
    state = response.json()["stream_state"]
    assert isinstance(state, str)
    return state


def flip(token: str, position: int) -> str:
    swapped = "A" if token[position] != "A" else "B"
    return token[:position] + swapped + token[position + 1 :]


@pytest.mark.parametrize(
    "case",
    [
        "tampered_middle",
        "tampered_end",
        "truncated",
        "foreign_request",
        "oversized",
        "not_a_string",
    ],
)
def test_untrusted_state_gets_400_and_server_keeps_serving(
    replicas: list[RunningServer], prompt_and_output: tuple[list[int], list[int]], case: str
) -> None:
    prompt, output = prompt_and_output
    server = replicas[1]
    state = first_state(server, prompt, output, "generate-tokens-chatcmpl-mine")
    request_id = "generate-tokens-chatcmpl-mine"
    bad: Any = {
        "tampered_middle": flip(state, len(state) // 2),
        "tampered_end": flip(state, len(state) - 1),
        "truncated": state[: len(state) // 2],
        "foreign_request": state,
        "oversized": "x" * 100_000,
        "not_a_string": [1, 2, 3],
    }[case]
    if case == "foreign_request":
        request_id = "generate-tokens-chatcmpl-someone-else"
    body = {
        "stream": True,
        "generate_chunk": generate_chunk(request_id, output[1:2], False),
        "stream_state": bad,
        "prompt_token_ids": prompt,
        "chat_request": CHAT,
    }
    response = httpx.post(server.url + PATH, json=body, timeout=30)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["type"] in ("BadRequestError", "Bad Request")
    ok = httpx.post(server.url + "/v1/chat/completions/render", json=CHAT, timeout=30)
    assert ok.status_code == 200
    assert server.alive()


def test_several_generate_chunks_in_one_call_equal_one_per_call(
    replicas: list[RunningServer], prompt_and_output: tuple[list[int], list[int]]
) -> None:
    prompt, output = prompt_and_output
    one_by_one, _ = run_stream(replicas[:1], prompt, output, request_id="generate-tokens-batched")
    chunks = [
        generate_chunk("generate-tokens-batched", output[i : i + 3], i + 3 >= len(output))
        for i in range(0, len(output), 3)
    ]
    state: Any = None
    content: list[str] = []
    arguments = ""
    for group in (chunks[:2], chunks[2:]):
        body = {"stream": True, "generate_chunks": group, "stream_state": state}
        if state is None:
            body |= {"prompt_token_ids": prompt, "chat_request": CHAT}
        payload = httpx.post(replicas[1].url + PATH, json=body, timeout=30).json()
        assert len(payload["chunks"]) == len(group)
        state = payload["stream_state"]
        for out in payload["chunks"]:
            delta = out["choices"][0]["delta"]
            content.append(delta.get("content") or "")
            for call in delta.get("tool_calls") or []:
                arguments += call["function"].get("arguments") or ""
    assert "".join(content) == one_by_one["content"]
    assert arguments == one_by_one["tool_calls"][0]["arguments"]
