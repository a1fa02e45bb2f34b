"""Messages -> chat conversion and checks, as vLLM 0.33's /v1/messages/render makes them."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from render_service.apis.messages import (
    check_request,
    merges_inline_system,
    request_param,
    to_chat_request,
)
from render_service.errors import SchemaError
from render_service.protocol.chat import ChatCompletionRequest
from render_service.protocol.messages import AnthropicMessagesRequest

WEATHER = {"properties": {"city": {"type": "string"}}}


def convert(
    body: dict[str, Any], merge: bool = False, effort: str = "none"
) -> ChatCompletionRequest:
    request = msgspec.convert({"model": "m", "max_tokens": 64, **body}, AnthropicMessagesRequest)
    check_request(request)
    return to_chat_request(request, merge_inline_system=merge, disabled_thinking_effort=effort)


def test_system_blocks_join_without_separator_and_drop_the_billing_header() -> None:
    chat = convert(
        {
            "system": [
                {"type": "text", "text": "x-anthropic-billing-header: cc=1;"},
                {"type": "text", "text": "You are terse."},
                {"type": "text", "text": " Answer in French."},
            ],
            "messages": [{"role": "user", "content": "Hi"}],
        }
    )
    assert chat.messages[0] == {"role": "system", "content": "You are terse. Answer in French."}


def test_inline_system_messages_stay_in_place_or_merge_into_the_first() -> None:
    body = {
        "system": "A.",
        "messages": [
            {"role": "user", "content": "Hi"},
            {"role": "system", "content": "B."},
            {"role": "user", "content": "Again"},
        ],
    }
    kept = convert(body)
    assert [m["role"] for m in kept.messages] == ["system", "user", "system", "user"]
    merged = convert(body, merge=True)
    assert merged.messages[0] == {"role": "system", "content": "A.B."}
    assert [m["role"] for m in merged.messages] == ["system", "user", "user"]


def test_tool_use_and_tool_result_become_calls_and_tool_messages() -> None:
    chat = convert(
        {
            "messages": [
                {"role": "user", "content": "Weather?"},
                {
                    "role": "assistant",
                    "content": [
                        {"type": "thinking", "thinking": "Call it.", "signature": "s"},
                        {"type": "redacted_thinking", "data": "opaque"},
                        {"type": "text", "text": "Checking."},
                        {"type": "tool_use", "id": "t1", "name": "w", "input": {"city": "Zürich"}},
                    ],
                },
                {
                    "role": "user",
                    "content": [
                        {
                            "type": "tool_result",
                            "tool_use_id": "t1",
                            "content": [{"type": "text", "text": "5 C"}],
                        },
                        {"type": "text", "text": "Thanks"},
                    ],
                },
            ]
        }
    )
    assistant, tool, user = chat.messages[1:]
    assert assistant["reasoning"] == "Call it."
    assert assistant["content"] == "Checking."
    # Python's json.dumps spelling (ASCII escapes, ", " and ": "), as vLLM writes history calls.
    assert assistant["tool_calls"][0]["function"] == {
        "name": "w",
        "arguments": '{"city": "Z\\u00fcrich"}',
    }
    assert tool == {"role": "tool", "tool_call_id": "t1", "content": "5 C"}
    assert user == {"role": "user", "content": "Thanks"}


def test_a_tool_result_in_an_assistant_turn_is_python_text() -> None:
    chat = convert(
        {
            "messages": [
                {
                    "role": "assistant",
                    "content": [
                        {
                            "type": "tool_result",
                            "tool_use_id": "t",
                            "content": [{"type": "text", "text": "42"}],
                        }
                    ],
                }
            ]
        }
    )
    assert chat.messages[0]["content"] == "Tool result: [{'type': 'text', 'text': '42'}]"


def test_tools_and_tool_choice() -> None:
    tools = [{"name": "w", "description": "d", "input_schema": WEATHER}]
    auto = convert({"tools": tools, "messages": [{"role": "user", "content": "x"}]})
    assert auto.tool_choice == "auto"
    assert auto.tools is not None
    assert auto.tools[0].function.parameters == {**WEATHER, "type": "object"}
    named = convert(
        {
            "tools": tools,
            "tool_choice": {"type": "tool", "name": "w", "disable_parallel_tool_use": True},
            "messages": [{"role": "user", "content": "x"}],
        }
    )
    assert named.tool_choice == {"type": "function", "function": {"name": "w"}}
    assert named.parallel_tool_calls is False
    anything = convert(
        {
            "tools": tools,
            "tool_choice": {"type": "any"},
            "messages": [{"role": "user", "content": "x"}],
        }
    )
    assert anything.tool_choice == "required"
    assert convert({"messages": [{"role": "user", "content": "x"}]}).tool_choice is None


def test_thinking_output_config_and_stream() -> None:
    base = {"messages": [{"role": "user", "content": "x"}]}
    assert (
        convert({**base, "thinking": {"type": "disabled"}}, effort="low").reasoning_effort == "low"
    )
    budget = convert(
        {**base, "max_tokens": 4096, "thinking": {"type": "enabled", "budget_tokens": 2048}}
    )
    assert budget.thinking_token_budget == 2048
    assert convert({**base, "output_config": {"effort": "high"}}).reasoning_effort == "high"
    schema = {"type": "object"}
    formatted = convert(
        {**base, "output_config": {"format": {"type": "json_schema", "schema": schema}}}
    )
    assert formatted.response_format == {
        "type": "json_schema",
        "json_schema": {"name": "json_schema", "schema": schema},
    }
    streamed = convert({**base, "stream": True})
    assert streamed.stream is True
    assert streamed.stream_options is not None
    assert streamed.stream_options.continuous_usage_stats is True
    assert convert({**base, "stop_sequences": ["END"]}).stop == ["END"]


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"max_tokens": 0}, "body.max_tokens"),
        ({"model": ""}, "body.model"),
        ({"max_tokens": 2048, "thinking": {"type": "enabled", "budget_tokens": 2048}}, "body"),
        ({"tool_choice": {"type": "tool"}}, "body.tool_choice"),
        (
            {
                "messages": [
                    {
                        "role": "user",
                        "content": [
                            {
                                "type": "tool_addition",
                                "tool": {"type": "tool_reference", "name": "w"},
                            }
                        ],
                    }
                ]
            },
            "body.messages.0",
        ),
    ],
)
def test_model_validators_report_vllms_params(body: dict[str, Any], param: str) -> None:
    full = {"model": "m", "max_tokens": 64, "messages": [{"role": "user", "content": "x"}], **body}
    with pytest.raises(SchemaError) as info:
        check_request(msgspec.convert(full, AnthropicMessagesRequest))
    assert info.value.param == param


def test_schema_error_params_follow_pydantics_union_and_tag_paths() -> None:
    assert request_param("body.messages.0.content.1.type", b"{}") == "body.messages.0.content"
    assert request_param("body.system.0.text", b"{}") == "body.system"
    raw = b'{"thinking": {"type": "enabled", "budget_tokens": 5}}'
    assert (
        request_param("body.thinking.budget_tokens", raw) == "body.thinking.enabled.budget_tokens"
    )
    assert request_param("body.max_tokens", b"{}") == "body.max_tokens"


def test_inline_system_detection_renders_a_late_system_message() -> None:
    strict = "{% for m in messages %}{% if m.role == 'system' and not loop.first %}{{ raise_exception('no') }}{% endif %}{{ m.content }}{% endfor %}"
    assert merges_inline_system(strict) is True
    assert merges_inline_system("{% for m in messages %}{{ m.content }}{% endfor %}") is False
    assert merges_inline_system(None) is True
