"""Every bad input gets the right 4xx in vLLM's error shape, and the server keeps serving."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.integration.server import RunningServer

CHAT = "/v1/chat/completions/render"
CMPL = "/v1/completions/render"
HI = [{"role": "user", "content": "Hi"}]
TOOL = {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}
JSON = {"Content-Type": "application/json"}


def chat(**fields: Any) -> bytes:
    return json.dumps({"messages": HI, **fields}).encode()


# (id, path, body bytes, headers, status, vLLM error type or None for a non-ErrorResponse body)
CASES: list[tuple[str, str, bytes, dict[str, str], int, str | None]] = [
    ("malformed_json", CHAT, b'{"messages": [', JSON, 400, "Bad Request"),
    ("body_is_array", CHAT, b"[1, 2]", JSON, 400, "Bad Request"),
    ("wrong_type_temperature", CHAT, chat(temperature="hot"), JSON, 400, "Bad Request"),
    ("unknown_model", CHAT, chat(model="no-such-model"), JSON, 404, "NotFoundError"),
    ("missing_messages", CHAT, b'{"model": "default"}', JSON, 400, "Bad Request"),
    ("messages_not_list", CHAT, b'{"messages": "hello"}', JSON, 400, "Bad Request"),
    ("empty_messages", CHAT, b'{"messages": []}', JSON, 400, "BadRequestError"),
    (
        "null_user_content",
        CHAT,
        b'{"messages": [{"role": "user", "content": null}]}',
        JSON,
        400,
        "Bad Request",
    ),
    ("message_without_role", CHAT, b'{"messages": [{"content": "x"}]}', JSON, 400, "Bad Request"),
    ("empty_tools", CHAT, chat(tools=[]), JSON, 400, "BadRequestError"),
    (
        "tool_choice_unknown_tool",
        CHAT,
        chat(tools=[TOOL], tool_choice={"type": "function", "function": {"name": "nope"}}),
        JSON,
        400,
        "BadRequestError",
    ),
    ("tool_choice_without_tools", CHAT, chat(tool_choice="required"), JSON, 400, "BadRequestError"),
    ("auto_tools_without_parser", CHAT, chat(tools=[TOOL]), JSON, 400, "BadRequestError"),
    (
        "prompt_too_long",
        CHAT,
        chat(messages=[{"role": "user", "content": "word " * 400}]),
        JSON,
        400,
        "BadRequestError",
    ),
    (
        "untrusted_template",
        CHAT,
        chat(chat_template="{{ messages }}"),
        JSON,
        400,
        "BadRequestError",
    ),
    (
        "untrusted_template_in_kwargs",
        CHAT,
        chat(chat_template_kwargs={"chat_template": "x"}),
        JSON,
        400,
        "BadRequestError",
    ),
    ("huge_body", CHAT, chat(user="x" * 2_000_000), JSON, 413, "BadRequestError"),
    (
        "invalid_utf8",
        CHAT,
        b'{"messages": [{"role": "user", "content": "\xff\xfe"}]}',
        JSON,
        400,
        None,
    ),
    ("wrong_content_type", CHAT, chat(), {"Content-Type": "text/plain"}, 400, "Bad Request"),
    ("negative_max_tokens", CHAT, chat(max_tokens=-5), JSON, 400, "BadRequestError"),
    (
        "max_completion_tokens_too_large",
        CHAT,
        chat(max_completion_tokens=10_000_000),
        JSON,
        400,
        "BadRequestError",
    ),
    (
        "stream_options_without_stream",
        CHAT,
        chat(stream_options={"include_usage": True}),
        JSON,
        400,
        "BadRequestError",
    ),
    ("top_logprobs_without_logprobs", CHAT, chat(top_logprobs=3), JSON, 400, "BadRequestError"),
    ("too_many_stop_strings", CHAT, chat(stop=["a", "b", "c", "d", "e"]), JSON, 400, "Bad Request"),
    (
        "continue_and_generation_prompt",
        CHAT,
        chat(continue_final_message=True),
        JSON,
        400,
        "BadRequestError",
    ),
    ("reasoning_effort_value", CHAT, chat(reasoning_effort="extreme"), JSON, 400, "Bad Request"),
    ("cache_salt_chars", CHAT, chat(cache_salt="a/b"), JSON, 400, "BadRequestError"),
    ("beam_search", CHAT, chat(use_beam_search=True), JSON, 400, "BadRequestError"),
    (
        "two_structured_kinds",
        CHAT,
        chat(structured_outputs={"regex": "a+", "choice": ["a"]}),
        JSON,
        400,
        "BadRequestError",
    ),
    (
        "json_schema_missing",
        CHAT,
        chat(response_format={"type": "json_schema"}),
        JSON,
        400,
        "BadRequestError",
    ),
    (
        "kv_prompt_ids_malformed",
        CHAT,
        chat(kv_transfer_params={"prompt_token_ids": ["a"]}),
        JSON,
        400,
        "BadRequestError",
    ),
    ("negative_temperature", CHAT, chat(temperature=-1), JSON, 400, "BadRequestError"),
    ("n_zero", CHAT, chat(n=0), JSON, 400, "BadRequestError"),
    ("seed_out_of_int64", CHAT, chat(seed=2**70), JSON, 400, "BadRequestError"),
    ("cmpl_missing_prompt", CMPL, b"{}", JSON, 400, "BadRequestError"),
    ("cmpl_empty_token_list", CMPL, b'{"prompt": []}', JSON, 400, "BadRequestError"),
    ("cmpl_token_out_of_vocab", CMPL, b'{"prompt": [1, 99999999]}', JSON, 400, "BadRequestError"),
    ("cmpl_bad_prompt_type", CMPL, b'{"prompt": [{"a": 1}]}', JSON, 400, "Bad Request"),
    ("cmpl_suffix", CMPL, b'{"prompt": "def f(", "suffix": "x"}', JSON, 400, "BadRequestError"),
    ("detokenize_negative", "/detokenize", b'{"tokens": [1, -1]}', JSON, 400, "Bad Request"),
    (
        "tokenize_unknown_model",
        "/tokenize",
        b'{"model": "nope", "prompt": "x"}',
        JSON,
        404,
        "NotFoundError",
    ),
]


@pytest.mark.parametrize(
    ("path", "body", "headers", "status", "error_type"),
    [pytest.param(*c[1:], id=c[0]) for c in CASES],
)
def test_bad_input_gets_4xx_and_server_keeps_serving(
    default_server: RunningServer,
    path: str,
    body: bytes,
    headers: dict[str, str],
    status: int,
    error_type: str | None,
) -> None:
    with default_server.client() as client:
        response = client.post(path, content=body, headers=headers)
        assert response.status_code == status, response.text
        payload = response.json()
        if error_type is None:
            assert payload == {"detail": "There was an error parsing the body"}
        else:
            assert set(payload) == {"error"}
            error = payload["error"]
            assert set(error) == {"message", "type", "param", "code"}
            assert error["type"] == error_type
            assert error["code"] == status
            assert isinstance(error["message"], str) and error["message"]
        ok = client.post(CHAT, json={"messages": HI})
        assert ok.status_code == 200
        assert ok.json()["token_ids"]
    assert default_server.alive()


def test_table_is_large_enough() -> None:
    assert len(CASES) >= 25
