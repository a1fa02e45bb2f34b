"""Shared pieces of the streaming-derender tests on the embedded default model (no ../shared):
a hermes tool-call output, the generate chunks vLLM's engine sends, and a client loop."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from starlette.testclient import TestClient

from render_service import Renderer
from render_service.http.app import build_app
from render_service.model.default_model import ensure_default_model

PATH = "/v1/chat/completions/derender"
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
TEXT = 'Let me check. <tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris 🌧"}}\n</tool_call><|im_end|>'
FLAGS: dict[str, Any] = {
    "enable_auto_tool_choice": True,
    "tool_call_parser": "hermes",
    "state_secret": "shared-secret",
    "served_model_name": "default",
}


def setup(directory: Path, **flags: Any) -> tuple[TestClient, Renderer, list[int], list[int]]:
    """A client of a server on the default model with ``flags`` (hermes by default), the chat's
    prompt ids and the output ids of ``TEXT``."""
    client = client_for(directory, **flags)
    renderer = client.app.state.service.renderer
    prompt = renderer.render_chat(CHAT).token_ids
    output = renderer.model.backend.encode(TEXT, add_special_tokens=False).ids
    return client, renderer, prompt, output


def client_for(directory: Path, **flags: Any) -> TestClient:
    """A client of a server on the default model (made in ``directory``) with ``flags``."""
    model = ensure_default_model(directory)
    return TestClient(build_app(Renderer.from_pretrained(str(model), **{**FLAGS, **flags})))


def chunk(request_id: str, ids: list[int], last: bool, index: int = 0) -> dict[str, Any]:
    """One generate chunk of one choice, as the engine streams it."""
    return {
        "request_id": request_id,
        "choices": [{"index": index, "finish_reason": "stop" if last else None, "token_ids": ids}],
    }


def same(answer: dict[str, Any]) -> dict[str, Any]:
    """A derendered chunk without its timestamp (the one field two equal answers differ in)."""
    return {key: value for key, value in answer.items() if key != "created"}


def single_stream(
    client: TestClient, prompt: list[int], output: list[int], request_id: str, lean: bool = False
) -> list[dict[str, Any]]:
    """vLLM's client loop, one id per call: the derendered chunks (``lean``: later calls send
    neither the prompt nor the chat request)."""
    return [answer for _, answer in run_stream([client], prompt, output, request_id, lean)]


def run_stream(
    replicas: list[TestClient],
    prompt: list[int],
    output: list[int],
    request_id: str,
    lean: bool = True,
) -> list[tuple[str, dict[str, Any]]]:
    """The client loop with chunk i sent to ``replicas[i % len(replicas)]``: each call's state
    and derendered chunk."""
    state: Any = None
    out = []
    for i, token in enumerate(output):
        body: dict[str, Any] = {
            "stream": True,
            "generate_chunk": chunk(request_id, [token], i == len(output) - 1),
            "stream_state": state,
        }
        if not lean or state is None:
            body |= {"prompt_token_ids": prompt, "chat_request": CHAT}
        response = replicas[i % len(replicas)].post(PATH, json=body)
        assert response.status_code == 200, response.text
        state = response.json()["stream_state"]
        out.append((state, same(response.json()["chunk"])))
    return out
