"""Stream states are bound to what they were made for, bounded before any work, and cached
under keys that cover everything a state depends on (issue 14, classes 2, 5 and 6).

Regressions: a state was accepted by another model's server sharing a served name, secret and
parser flags, and a completions state by chat derender (which then skipped the parsers); a
vLLM-format state of millions of ids was replayed for seconds before any bound, its replay kept
running after the request was abandoned; two streams with one request id and different prompts
shared a cached parser. Runs on the embedded default model (no ../shared).
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest
from starlette.testclient import TestClient

from render_service import Renderer
from render_service.abandon import run_abandonable
from render_service.derender.machine import OutputOptions
from render_service.errors import RequestAbandoned
from render_service.http.app import build_app
from render_service.model.default_model import ensure_default_model

CHAT = {"messages": [{"role": "user", "content": "Say hello."}]}
CHAT_PATH = "/v1/chat/completions/derender"
COMPLETIONS_PATH = "/v1/completions/derender"
MESSAGES_PATH = "/v1/messages/derender"
RESPONSES_PATH = "/v1/responses/derender"
HELLO = [9707, 0, 21927]  # ids of the default model's vocabulary


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return ensure_default_model(Path(tmp_path_factory.mktemp("binding-model")))


def make_client(model_dir: Path, **flags: Any) -> TestClient:
    flags.setdefault("state_secret", "a-secret-shared-by-the-replicas-of-test")
    return TestClient(build_app(Renderer.from_pretrained(str(model_dir), **flags)))


@pytest.fixture(scope="module")
def client(model_dir: Path) -> TestClient:
    return make_client(model_dir, max_model_len=256)


def chunk(ids: list[int], last: bool = False, request_id: str = "r") -> dict[str, Any]:
    return {
        "request_id": request_id,
        "choices": [{"index": 0, "finish_reason": "stop" if last else None, "token_ids": ids}],
    }


def first_state(client: TestClient, path: str, request_id: str = "r") -> str:
    body: dict[str, Any] = {"stream": True, "generate_chunk": chunk(HELLO, request_id=request_id)}
    response = client.post(path, json=body)
    assert response.status_code == 200, response.text
    state = response.json()["stream_state"]
    assert isinstance(state, str)
    return state


def next_chunk(client: TestClient, path: str, state: Any, request_id: str = "r") -> Any:
    body = {"stream": True, "generate_chunk": chunk(HELLO, request_id=request_id)}
    return client.post(path, json={**body, "stream_state": state})


# ---- class 5: a state continues only the endpoint and model it was issued for ---------------


@pytest.mark.parametrize(
    "issued,used", [(CHAT_PATH, COMPLETIONS_PATH), (COMPLETIONS_PATH, CHAT_PATH)]
)
def test_a_state_is_refused_by_the_other_endpoint(
    client: TestClient, issued: str, used: str
) -> None:
    state = first_state(client, issued)
    assert next_chunk(client, issued, state).status_code == 200
    state = first_state(client, issued, "r2")
    # Both with the cache hint (digest prefix) and without it (verification only).
    for token in (state, state.partition(".")[2]):
        response = next_chunk(client, used, token, "r2")
        assert response.status_code == 400, response.text
        assert response.json()["error"]["param"] == "stream_state"


@pytest.mark.parametrize(
    "issued,used",
    [(MESSAGES_PATH, RESPONSES_PATH), (RESPONSES_PATH, MESSAGES_PATH)],
)
def test_an_api_state_and_its_chat_part_continue_only_that_api(
    client: TestClient, issued: str, used: str
) -> None:
    api = {MESSAGES_PATH: "messages_request", RESPONSES_PATH: "responses_request"}
    requests = {
        MESSAGES_PATH: {
            "model": "m",
            "max_tokens": 16,
            "messages": [{"role": "user", "content": "Hi"}],
        },
        RESPONSES_PATH: {"model": "m", "input": [{"role": "user", "content": "Hi"}]},
    }
    body: dict[str, Any] = {
        "stream": True,
        "generate_chunk": chunk(HELLO),
        api[issued]: requests[issued],
    }
    first = client.post(issued, json=body)
    assert first.status_code == 200, first.text
    state = first.json()["stream_state"]
    assert next_chunk(client, issued, state).status_code == 200
    refused = client.post(
        used,
        json={"stream": True, "generate_chunk": chunk(HELLO), "stream_state": state},
    )
    assert refused.status_code == 400, refused.text
    assert refused.json()["error"]["param"] == "stream_state"
    # The chat machine's part of the state is signed for the API too: chat derender refuses it.
    chat_part = state.rpartition("~")[0]
    response = next_chunk(client, CHAT_PATH, chat_part)
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == "stream_state"


def test_a_state_is_refused_by_another_model_with_the_same_name_secret_and_flags(
    model_dir: Path, client: TestClient
) -> None:
    other = make_client(model_dir, max_model_len=256, chat_template="{{ messages[0]['content'] }}")
    state = first_state(client, CHAT_PATH)
    response = next_chunk(other, CHAT_PATH, state.partition(".")[2])
    assert response.status_code == 400, response.text
    assert "verification" in response.json()["error"]["message"]


def test_the_state_context_names_kind_model_and_parser_flags(model_dir: Path) -> None:
    from render_service.derender.derenderer import state_context

    renderer = Renderer.from_pretrained(str(model_dir))
    settings = renderer.settings
    base = state_context(renderer.model, settings, "chat")
    assert base != state_context(renderer.model, settings, "completions")
    assert renderer.model.identity.hex().encode() in base
    for change in (
        {"tool_call_parser": "hermes", "enable_auto_tool_choice": True},
        {"default_chat_template_kwargs": {"enable_thinking": False}},
        {"tool_strict_level": "parameter"},
    ):
        changed = type(settings)(**{**_fields(settings), **change})
        assert state_context(renderer.model, changed, "chat") != base


def _fields(settings: Any) -> dict[str, Any]:
    return {name: getattr(settings, name) for name in settings.__struct_fields__}


# ---- class 6: the parser cache key covers the prompts -----------------------------------------


def test_streams_with_one_request_id_and_different_prompts_have_different_keys(
    model_dir: Path,
) -> None:
    renderer = Renderer.from_pretrained(str(model_dir))
    from render_service.derender import build_derenderer

    machine = build_derenderer(renderer.model, renderer.parsing, renderer.settings).machine
    options = OutputOptions()
    a = machine.start("r", 0, [1, 2, 3], options, None)
    same = machine.start("r", 0, [1, 2, 3], options, None)
    b = machine.start("r", 0, [1, 2, 4], options, None)
    c = machine.start("r", 0, [1, 2, 3], options, None, parser_prompt=[1, 2])
    d = machine.start("r", 0, [1, 2, 3], options, None, kind="completions")
    assert a.digest == same.digest
    assert len({a.digest, b.digest, c.digest, d.digest}) == 4


# ---- class 2: vLLM-format states are bounded before any work; replay stops when abandoned ----


def vllm_state(ids: list[int], **extra: Any) -> dict[str, Any]:
    return {"output_token_ids": ids, "output_chunk_lens": [len(ids)] if ids else [], **extra}


def test_a_vllm_state_longer_than_the_context_is_refused(client: TestClient) -> None:
    ok = next_chunk(client, CHAT_PATH, vllm_state(HELLO * 10))
    assert ok.status_code == 200, ok.text
    for field in ("output_token_ids", "prev_tokens", "output_chunk_lens", "last_tool_call_ids"):
        items: list[Any] = [1] * 257 if field != "prev_tokens" else ["a"] * 257
        state = {**vllm_state([]), field: items}
        response = next_chunk(client, CHAT_PATH, state)
        assert response.status_code == 400, response.text
        assert f"stream_state.{field} has 257 items" in response.json()["error"]["message"]


def test_a_large_json_object_as_state_is_refused_like_a_large_string(
    model_dir: Path,
) -> None:
    small = make_client(model_dir, max_model_len=256, max_vllm_stream_state_bytes=100_000)
    big = {**vllm_state([]), "padding": "x" * 10_000_000}
    response = next_chunk(small, CHAT_PATH, big)
    assert response.status_code == 400
    assert "--max-vllm-stream-state-bytes" in response.json()["error"]["message"]
    nested = {**vllm_state([]), "junk": [[i] * 50 for i in range(10_000)]}
    assert next_chunk(small, CHAT_PATH, nested).status_code == 400
    assert next_chunk(small, CHAT_PATH, vllm_state(HELLO)).status_code == 200


def test_the_replay_of_an_abandoned_request_stops(model_dir: Path) -> None:
    renderer = Renderer.from_pretrained(str(model_dir), max_model_len=4096)
    from render_service.derender import build_derenderer
    from render_service.protocol.derender import (
        DerenderChatStreamRequest,
        GenerateChoice,
        GenerateChunk,
    )

    derenderer = build_derenderer(renderer.model, renderer.parsing, renderer.settings)
    steps = 0
    step = derenderer.machine.step

    def counting_step(*args: Any, **kwargs: Any) -> Any:
        nonlocal steps
        steps += 1
        abandoned.set()  # the client goes away during the first slice
        return step(*args, **kwargs)

    derenderer.machine.step = counting_step  # type: ignore[method-assign]
    body = DerenderChatStreamRequest(
        stream=True,
        generate_chunk=GenerateChunk(
            request_id="r",
            choices=[GenerateChoice(index=0, finish_reason=None, token_ids=HELLO)],
        ),
        stream_state=vllm_state(HELLO * 1300),
    )
    abandoned = threading.Event()
    with pytest.raises(RequestAbandoned):
        run_abandonable(abandoned, derenderer.derender_chat_stream, body)
    assert steps == 1  # of the 8 slices a full replay of 3,900 ids takes
