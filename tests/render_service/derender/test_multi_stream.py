"""One call for one engine step of many streams: each item is answered as a single-stream call
would be (its chunk and next state, or its own error), in order, in JSON or msgpack.

Runs on the embedded default model (no ../shared).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec
import pytest
from starlette.testclient import TestClient

from render_service import Renderer
from render_service.protocol.derender import DerenderChatStreamRequest, GenerateChunk
from tests.render_service.derender._streams import CHAT, PATH, chunk, same, setup, single_stream

Setup = tuple[TestClient, Renderer, list[int], list[int]]
STREAMS = "/v1/chat/completions/derender/streams"
MSGPACK = "application/msgpack"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Setup:
    return setup(Path(tmp_path_factory.mktemp("streams-model")))


def step_all(
    client: TestClient,
    prompt: list[int],
    output: list[int],
    ids: list[str],
    msgpack: bool = False,
) -> dict[str, list[dict[str, Any]]]:
    """All streams ``ids`` advanced one id per step, one multi-stream call per step; stream k
    starts k steps late, so that steps mix first calls, later calls and finished streams."""
    states: dict[str, Any] = dict.fromkeys(ids)
    out: dict[str, list[dict[str, Any]]] = {i: [] for i in ids}
    for step in range(len(output) + len(ids)):
        items, live = [], []
        for k, request_id in enumerate(ids):
            position = step - k
            if not 0 <= position < len(output):
                continue
            item: dict[str, Any] = {
                "generate_chunk": chunk(
                    request_id, output[position : position + 1], position == len(output) - 1
                ),
                "stream_state": states[request_id],
            }
            if states[request_id] is None:
                item |= {"prompt_token_ids": prompt, "chat_request": CHAT}
            items.append(item)
            live.append(request_id)
        if not items:
            continue
        results = post(client, {"items": items}, msgpack)
        assert len(results) == len(items)
        for request_id, result in zip(live, results, strict=True):
            assert "error" not in result, result
            states[request_id] = result["stream_state"]
            out[request_id].append(same(result["chunk"]))
    return out


def post(client: TestClient, body: dict[str, Any], msgpack: bool = False) -> list[dict[str, Any]]:
    if msgpack:
        response = client.post(
            STREAMS,
            content=msgspec.msgpack.encode(body),
            headers={"Content-Type": MSGPACK, "Accept": MSGPACK},
        )
        assert response.status_code == 200, response.content
        assert response.headers["content-type"] == MSGPACK
        items: list[dict[str, Any]] = msgspec.msgpack.decode(response.content)["items"]
        return items
    response = client.post(STREAMS, json=body)
    assert response.status_code == 200, response.text
    items = response.json()["items"]
    return items


@pytest.mark.parametrize("msgpack", [False, True], ids=["json", "msgpack"])
def test_each_stream_equals_its_single_stream_calls(server: Setup, msgpack: bool) -> None:
    client, _, prompt, output = server
    ids = [f"generate-tokens-multi-{k}" for k in range(3)]
    many = step_all(client, prompt, output, ids, msgpack)
    for request_id in ids:
        assert many[request_id] == single_stream(client, prompt, output, request_id)
    assert many[ids[0]][-1]["choices"][0]["finish_reason"] == "tool_calls"


def test_a_failing_item_gets_its_own_error_and_the_others_go_on(server: Setup) -> None:
    client, _, prompt, output = server
    good = {
        "generate_chunk": chunk("generate-tokens-good", output[:1], False),
        "prompt_token_ids": prompt,
        "chat_request": CHAT,
    }
    results = post(
        client,
        {
            "items": [
                good,
                {**good, "stream_state": "forged.state"},
                {**good, "chat_request": {**CHAT, "stop": ["x"]}},
                {**good, "prompt_token_ids": ["x"]},
                good,
            ]
        },
    )
    assert [sorted(r) for r in results] == [
        ["chunk", "stream_state"],
        ["error"],
        ["error"],
        ["error"],
        ["chunk", "stream_state"],
    ]
    for result in results[1:4]:
        assert result["error"]["code"] == 400
    assert "stream_state" in results[1]["error"]["message"]
    assert "stop" in results[2]["error"]["message"].lower()
    assert "prompt_token_ids" in results[3]["error"]["message"]
    assert results[0]["chunk"]["choices"] == results[4]["chunk"]["choices"]


def test_a_failing_lean_item_gets_the_error_of_its_single_stream_call(server: Setup) -> None:
    """Items that continue a signed state without inputs (most items of a running step) take a
    shorter path: each bad one gets the error a lean single-stream call gets, in order, and the
    good items go on."""
    client, _, prompt, output = server
    request_id = "generate-tokens-lean-errors"
    first = post(
        client,
        {
            "items": [
                {
                    "generate_chunk": chunk(request_id, output[:1], False),
                    "prompt_token_ids": prompt,
                    "chat_request": CHAT,
                }
            ]
        },
    )
    state = first[0]["stream_state"]
    head, constant, moving = state.split(".")
    flipped = moving[:5] + ("A" if moving[5] != "A" else "B") + moving[6:]
    good = {"generate_chunk": chunk(request_id, output[1:2], False), "stream_state": state}
    bad = [
        {**good, "stream_state": "forged.state"},
        {**good, "stream_state": f"{head}.{constant}.{flipped}"},
        {**good, "stream_state": f"{constant}.{flipped}"},
        {**good, "generate_chunk": chunk("generate-tokens-another", output[1:2], False)},
        {**good, "generate_chunk": chunk(request_id, output[1:2], False, index=1)},
        {**good, "generate_chunk": chunk(request_id, [0] * 10**6, False)},
        {**good, "stream_state": 7},
    ]
    results = post(client, {"items": [*bad, good]})
    for item, result in zip(bad, results, strict=False):
        single = client.post(PATH, json={"stream": True, **item})
        assert single.status_code == result["error"]["code"] >= 400, single.text
        assert result["error"] == single.json()["error"]
    assert sorted(results[-1]) == ["chunk", "stream_state"]
    alone = single_stream(client, prompt, output[:3], "generate-tokens-lean-alone", lean=True)
    assert same(results[-1]["chunk"]) == alone[1] | {"id": request_id}


def test_the_whole_call_fails_on_the_wrong_model_or_a_bad_body(server: Setup) -> None:
    client, _, _, output = server
    item = {"generate_chunk": chunk("generate-tokens-m", output[:1], False)}
    wrong = client.post(STREAMS, json={"model": "not-this-one", "items": [item]})
    assert wrong.status_code == 404
    no_items = client.post(STREAMS, json={"stream": True})
    assert no_items.status_code == 400
    assert no_items.json()["error"]["type"] == "Bad Request"
    text = client.post(STREAMS, content=b"{}", headers={"Content-Type": "text/plain"})
    assert text.status_code == 400
    assert "application/msgpack" in text.json()["error"]["message"]
    garbage = client.post(STREAMS, content=b"\xc1\xc1", headers={"Content-Type": MSGPACK})
    assert garbage.status_code == 400


def test_library_call_takes_single_stream_bodies(server: Setup) -> None:
    client, renderer, prompt, output = server
    derenderer = client.app.state.service.derenderer
    bodies = [
        DerenderChatStreamRequest(
            stream=True,
            generate_chunk=msgspec.convert(
                chunk(f"generate-tokens-lib-{k}", output[:2], False), GenerateChunk
            ),
            prompt_token_ids=prompt,
            chat_request=CHAT,
        )
        for k in range(2)
    ]
    answer = derenderer.derender_chat_streams(bodies)
    assert len(answer.items) == 2
    first = msgspec.to_builtins(answer.items[0])
    single = single_stream(client, prompt, output[:2], "generate-tokens-lib-0")
    # One library item with two ids derenders as one chunk of two ids.
    assert first["chunk"]["choices"][0]["delta"]["content"] == "".join(
        c["choices"][0]["delta"].get("content") or "" for c in single
    )
    assert isinstance(first["stream_state"], str)
    assert first["chunk"]["model"] == renderer.model_name
