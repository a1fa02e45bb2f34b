"""examples/: the client's three-hop loop against a real render-service and the fake engine,
and the fake engine's answers in vLLM 0.33's generate shapes."""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from examples import client
from examples.fake_engine import Script, running_engine
from render_service.model.default_model import ensure_default_model
from tests.integration.server import RunningServer, running_server

HELLO = Script.load(Path(__file__).resolve().parents[2] / "examples" / "hello.json")
HELLO_TEXT = (
    "Hello! I am a fake engine: I replay token ids from a script, as a real engine streams them."
)
IM_END = 151645


@pytest.fixture(scope="module")
def render(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    model = ensure_default_model(tmp_path_factory.mktemp("model"))
    argv = [str(model), "--enable-auto-tool-choice", "--tool-call-parser", "hermes"]
    server: RunningServer
    with running_server(argv, tmp_path_factory.mktemp("examples")) as server:
        yield server.url


@pytest.fixture(scope="module")
def engine() -> Iterator[str]:
    with running_engine(HELLO) as url:
        yield url


def generate(engine: str, body: dict[str, Any], headers: dict[str, str] | None = None) -> Any:
    request = urllib.request.Request(
        f"{engine}/inference/v1/generate",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json", **(headers or {})},
    )
    with urllib.request.urlopen(request) as answer:
        raw = answer.read().decode()
    if not body.get("stream"):
        return json.loads(raw)
    return [line.removeprefix("data: ") for line in raw.split("\n\n") if line]


def test_the_client_loop_streams_the_scripted_answer(
    render: str, engine: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    sent: list[dict[str, Any]] = []
    real_post = client.post

    def recording_post(url: str, body: dict[str, Any], api_key: str | None = None) -> Any:
        sent.append(body)
        return real_post(url, body, api_key)

    monkeypatch.setattr(client, "post", recording_post)
    answer = client.chat({"messages": [{"role": "user", "content": "Hi"}]}, render, engine)
    assert answer.content == HELLO_TEXT
    assert answer.finish_reason == "stop"
    assert len(answer.chunks) == len(HELLO.chunks)
    assert [c["choices"][0]["finish_reason"] for c in answer.chunks] == [None] * (
        len(HELLO.chunks) - 1
    ) + ["stop"]
    render_call, first, *rest = sent
    assert "messages" in render_call
    assert "prompt_token_ids" in first and "chat_request" in first
    assert rest and all(set(body) == {"stream", "generate_chunk", "stream_state"} for body in rest)


def test_the_client_prints_as_the_quickstart_shows(
    render: str, engine: str, capsys: pytest.CaptureFixture[str]
) -> None:
    client.main(["Hi", "--render", render, "--engine", engine])
    assert capsys.readouterr().out == f"{HELLO_TEXT}\nfinish_reason: stop\n"
    client.main(["Hi", "--render", render, "--engine", engine, "--chunks", "--max-tokens", "4"])
    lines = [line for line in capsys.readouterr().out.splitlines() if line]
    assert lines[-1] == "data: [DONE]"
    chunks = [json.loads(line.removeprefix("data: ")) for line in lines[:-1]]
    assert [c["choices"][0]["finish_reason"] for c in chunks] == [None, "length"]
    assert "".join(c["choices"][0]["delta"]["content"] for c in chunks) == "Hello! I am"


def test_a_tool_call_streams_through_the_hermes_parser(render: str) -> None:
    call = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
    tokenize = urllib.request.Request(
        f"{render}/tokenize",
        data=json.dumps({"prompt": call, "add_special_tokens": False}).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(tokenize) as answer:
        ids = json.loads(answer.read())["tokens"]
    script = Script({"chunks": [ids[i : i + 2] for i in range(0, len(ids), 2)] + [[IM_END]]})
    tools = [
        {
            "type": "function",
            "function": {
                "name": "get_weather",
                "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
            },
        }
    ]
    request = {"messages": [{"role": "user", "content": "Weather in Paris?"}], "tools": tools}
    with running_engine(script) as url:
        answer = client.chat(request, render, url)
    assert answer.finish_reason == "tool_calls"
    names = [c["function"].get("name") for c in answer.tool_calls if c["function"].get("name")]
    arguments = "".join(c["function"].get("arguments") or "" for c in answer.tool_calls)
    assert names == ["get_weather"] and json.loads(arguments) == {"city": "Paris"}


def test_engine_stream_events_have_vllms_shape(engine: str) -> None:
    body = {"request_id": "chatcmpl-x", "token_ids": [1, 2, 3], "stream": True}
    events = generate(engine, {**body, "return_token_ids": True}, {"X-Request-Id": "abc"})
    assert events[-1] == "[DONE]"
    payloads = [json.loads(e) for e in events[:-1]]
    assert list(payloads[0]) == [
        "request_id",
        "usage",
        "prompt_token_ids",
        "output_mode",
        "choices",
    ]
    assert all("prompt_token_ids" not in p for p in payloads[1:])
    assert {p["request_id"] for p in payloads} == {"generate-tokens-abc"}
    assert [p["choices"][0]["token_ids"] for p in payloads] == HELLO.chunks
    assert [p["choices"][0]["finish_reason"] for p in payloads][-2:] == [None, "stop"]


def test_engine_cuts_at_max_tokens_interleaves_choices_and_counts_usage(engine: str) -> None:
    body = {
        "request_id": "r",
        "token_ids": [1, 2, 3],
        "stream": True,
        "sampling_params": {"max_tokens": 5, "n": 2},
        "stream_options": {"include_usage": True},
    }
    payloads = [json.loads(e) for e in generate(engine, body)[:-1]]
    *steps, usage = payloads
    assert [p["choices"][0]["index"] for p in steps] == [0, 1, 0, 1]
    assert [p["choices"][0]["token_ids"] for p in steps[::2]] == [HELLO.chunks[0], [1079, 264]]
    assert steps[-1]["choices"][0]["finish_reason"] == "length"
    assert usage["choices"] == [] and usage["usage"] == {
        "prompt_tokens": 3,
        "total_tokens": 13,
        "completion_tokens": 10,
    }


def test_engine_batch_answer_derenders(engine: str, render: str) -> None:
    chat_request = {"messages": [{"role": "user", "content": "Hi"}]}
    rendered = client.post(f"{render}/v1/chat/completions/render", chat_request)
    answer = generate(engine, rendered)
    assert answer["choices"][0]["token_ids"] == [i for c in HELLO.chunks for i in c]
    derendered = client.post(
        f"{render}/v1/chat/completions/derender",
        {
            "generate_response": answer,
            "prompt_token_ids": rendered["token_ids"],
            "chat_request": chat_request,
        },
    )
    assert derendered["choices"][0]["message"]["content"] == HELLO_TEXT


def test_engine_refuses_stop_strings_as_a_tokens_only_vllm(engine: str) -> None:
    body = {"request_id": "r", "token_ids": [1], "sampling_params": {"stop": ["x"]}}
    with pytest.raises(urllib.error.HTTPError) as caught:
        generate(engine, body)
    assert caught.value.code == 400
    assert "stop strings are not supported" in json.loads(caught.value.read())["error"]["message"]


def test_a_script_must_be_token_id_chunks() -> None:
    with pytest.raises(ValueError, match="chunks"):
        Script({"chunks": ["not ids"]})
