"""A derender seed from render starts a stream with no prompt and no chat request, and a
derender replica started with other flags than the render replica refuses it naming the flag.

Runs on the embedded default model (no ../shared).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from starlette.testclient import TestClient

from render_service import Renderer
from tests.render_service.derender._streams import (
    CHAT,
    PATH,
    chunk,
    client_for,
    same,
    setup,
    single_stream,
)

Setup = tuple[TestClient, Renderer, list[int], list[int]]
RENDER = "/v1/chat/completions/render"


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return Path(tmp_path_factory.mktemp("seed-model"))


@pytest.fixture(scope="module")
def server(model_dir: Path) -> Setup:
    return setup(model_dir)


def seed_of(client: TestClient, chat: dict[str, Any] = CHAT) -> str:
    response = client.post(RENDER, json=chat, headers={"X-Derender-Seed": "true"})
    assert response.status_code == 200, response.text
    seed: str = response.json()["derender_seed"]
    return seed


def seeded_stream(
    client: TestClient, seed: str, output: list[int], request_id: str, index: int = 0
) -> list[dict[str, Any]]:
    state: Any = None
    out = []
    for i, token in enumerate(output):
        body: dict[str, Any] = {
            "stream": True,
            "generate_chunk": chunk(request_id, [token], i == len(output) - 1, index),
            "stream_state": state,
        }
        if state is None:
            body["derender_seed"] = seed
        response = client.post(PATH, json=body)
        assert response.status_code == 200, response.text
        state = response.json()["stream_state"]
        out.append(same(response.json()["chunk"]))
    return out


def text_of(answer: dict[str, Any]) -> tuple[Any, ...]:
    """A chunk's delta without its tool-call ids (a choice's own)."""
    delta = answer["choices"][0]["delta"]
    calls = [
        (c["function"]["name"], c["function"]["arguments"]) for c in delta.get("tool_calls") or ()
    ]
    return delta.get("content"), delta.get("reasoning"), calls


def test_render_answers_a_seed_only_when_asked(server: Setup) -> None:
    client, _, prompt, _ = server
    plain = client.post(RENDER, json=CHAT).json()
    assert "derender_seed" not in plain
    asked = client.post(RENDER, json=CHAT, headers={"X-Derender-Seed": "true"}).json()
    assert asked["token_ids"] == plain["token_ids"] == prompt
    assert isinstance(asked["derender_seed"], str)


def test_a_seeded_stream_equals_a_stream_with_prompt_and_chat_request(server: Setup) -> None:
    client, _, prompt, output = server
    seed = seed_of(client)
    seeded = seeded_stream(client, seed, output, "generate-tokens-seeded")
    full = single_stream(client, prompt, output, "generate-tokens-seeded")
    assert seeded == full
    assert seeded[-1]["choices"][0]["finish_reason"] == "tool_calls"
    # One seed starts every choice of the request, each by its own index.
    second = seeded_stream(client, seed, output, "generate-tokens-seeded", index=1)
    assert [text_of(c) for c in second] == [text_of(c) for c in full]


def test_a_seeded_multi_stream_item_works(server: Setup) -> None:
    client, _, _, output = server
    item = {"generate_chunk": chunk("generate-tokens-seed-multi", output[:1], False)}
    response = client.post(
        "/v1/chat/completions/derender/streams",
        json={"items": [{**item, "derender_seed": seed_of(client)}]},
    )
    assert response.status_code == 200, response.text
    assert isinstance(response.json()["items"][0]["stream_state"], str)


@pytest.mark.parametrize(
    ("flags", "named"),
    [
        ({"served_model_name": "other-name"}, "--served-model-name"),
        ({"tool_call_parser": None, "enable_auto_tool_choice": False}, "--tool-call-parser"),
        ({"max_model_len": 512}, "--max-model-len"),
        (
            {"default_chat_template_kwargs": {"enable_thinking": False}},
            "--default-chat-template-kwargs",
        ),
    ],
    ids=["served_model_name", "tool_call_parser", "max_model_len", "kwargs"],
)
def test_a_replica_with_other_flags_refuses_the_seed_naming_the_flag(
    server: Setup, model_dir: Path, flags: dict[str, Any], named: str
) -> None:
    client, _, _, output = server
    other = client_for(model_dir, **flags)
    body = {
        "stream": True,
        "generate_chunk": chunk("generate-tokens-other", output[:1], False),
        "derender_seed": seed_of(client),
    }
    if "served_model_name" in flags:
        body["model"] = "other-name"
    response = other.post(PATH, json=body)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert named in error["message"]
    assert error["param"] == "derender_seed"


def test_forged_foreign_and_stop_string_seeds_are_400(server: Setup, model_dir: Path) -> None:
    client, _, _, output = server
    seed = seed_of(client)
    foreign = client_for(model_dir, state_secret="another-secret")

    def start(target: TestClient, token: str) -> Any:
        body = {
            "stream": True,
            "generate_chunk": chunk("generate-tokens-forged", output[:1], False),
            "derender_seed": token,
        }
        return target.post(PATH, json=body)

    middle = len(seed) // 2
    forged = seed[:middle] + ("A" if seed[middle] != "A" else "B") + seed[middle + 1 :]
    assert start(client, forged).status_code == 400
    assert start(foreign, seed).status_code == 400
    stops = seed_of(client, {**CHAT, "stop": ["weather"]})
    refused = start(client, stops)
    assert refused.status_code == 400
    assert "stop" in refused.json()["error"]["message"].lower()
