"""Responses -> chat messages and tools, and the request checks, as vLLM 0.33 makes them."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from render_service.apis.responses import (
    check_request,
    check_text_format,
    input_messages,
    refuse_previous_response,
    request_param,
    template_tools,
)
from render_service.errors import InvalidRequest, SchemaError
from render_service.protocol.responses import ResponsesRequest

FUNCTION = {"type": "function", "name": "w", "parameters": {"type": "object"}}


def request(body: dict[str, Any]) -> ResponsesRequest:
    parsed = msgspec.convert({"input": "x", **body}, ResponsesRequest)
    return msgspec.structs.replace(parsed, tool_choice=check_request(parsed))


def test_a_string_input_is_one_user_turn_after_the_instructions() -> None:
    assert input_messages(request({"instructions": "Be brief.", "input": "Hi"})) == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hi"},
    ]


def test_reasoning_calls_and_outputs_merge_into_one_assistant_turn() -> None:
    items = [
        {"role": "user", "content": "Weather?"},
        {"type": "reasoning", "summary": [], "content": [{"type": "reasoning_text", "text": "r"}]},
        {"type": "function_call", "call_id": "a", "name": "w", "arguments": "{}"},
        {
            "type": "function_call",
            "call_id": "b",
            "name": "f",
            "namespace": "ns",
            "arguments": "{}",
        },
        {"type": "function_call_output", "call_id": "a", "output": "sunny"},
        {
            "type": "message",
            "role": "assistant",
            "content": [{"type": "output_text", "text": "Done."}],
        },
    ]
    messages = input_messages(request({"input": items}))
    assert messages[1] == {
        "role": "assistant",
        "reasoning": "r",
        "tool_calls": [
            {"id": "a", "function": {"name": "w", "arguments": "{}"}, "type": "function"},
            {"id": "b", "function": {"name": "ns__f", "arguments": "{}"}, "type": "function"},
        ],
    }
    assert messages[2] == {"role": "tool", "content": "sunny", "tool_call_id": "a"}
    assert messages[3] == {"role": "assistant", "content": "Done."}


def test_summary_stands_in_for_reasoning_content() -> None:
    item = {"type": "reasoning", "summary": [{"type": "summary_text", "text": "s"}]}
    assert input_messages(request({"input": [item]})) == [{"role": "assistant", "reasoning": "s"}]


@pytest.mark.parametrize(
    "item",
    [
        {"type": "function_call", "call_id": "a", "name": "w"},
        {"type": "function_call_output", "call_id": "a"},
        {"role": "tool", "content": "x"},
        {"type": "bogus_item"},
        {"type": "reasoning"},
        {"role": "user", "content": [{"type": "input_text"}]},
        {"type": "message", "role": "assistant", "content": []},
        "a string",
    ],
)
def test_malformed_items_are_schema_errors_at_body_input(item: Any) -> None:
    with pytest.raises(SchemaError) as info:
        request({"input": [item]})
    assert info.value.param == "body.input"


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"tool_choice": "required"}, "tool_choice"),
        ({"tool_choice": {"type": "function", "name": "nope"}, "tools": [FUNCTION]}, "tool_choice"),
        ({"tools": [{"type": "custom", "name": "g", "format": {"type": "grammar"}}]}, "tools"),
        ({"background": True, "store": False}, "background"),
        ({"prompt": {"id": "p"}}, "prompt"),
    ],
)
def test_request_checks_name_their_parameter(body: dict[str, Any], param: str) -> None:
    with pytest.raises(InvalidRequest) as info:
        request(body)
    assert info.value.param == param


def test_tool_choice_without_tools_becomes_none_and_local_names_resolve() -> None:
    assert request({}).tool_choice == "none"
    namespace = {"type": "namespace", "name": "ns", "tools": [FUNCTION]}
    named = request({"tools": [namespace], "tool_choice": {"type": "function", "name": "w"}})
    assert named.tool_choice == {"type": "function", "name": "ns__w"}


def test_template_tools_flatten_namespaces_and_shim_custom_tools() -> None:
    tools = [
        {**FUNCTION, "strict": True},
        {"type": "namespace", "name": "ns", "tools": [FUNCTION]},
        {"type": "custom", "name": "sh", "description": "run"},
        {"type": "web_search_preview"},
    ]
    out = template_tools(request({"tools": tools}), exclude_when_none=False)
    assert out is not None
    assert [t["function"]["name"] for t in out] == ["w", "ns__w", "sh"]
    assert out[0]["function"]["strict"] is True
    assert out[2]["function"]["parameters"]["required"] == ["input"]


def test_text_format_and_structured_outputs() -> None:
    schema = {"type": "object"}
    fmt = {"format": {"type": "json_schema", "name": "n", "schema": schema}}
    assert check_text_format(request({"text": fmt})) == {"json": schema}
    assert check_text_format(request({"text": {"format": {"type": "json_object"}}})) == {
        "json_object": True
    }
    with pytest.raises(InvalidRequest):
        check_text_format(request({"text": fmt, "structured_outputs": {"json": schema}}))


def test_previous_response_id_is_refused_with_openais_error_type() -> None:
    refuse_previous_response(request({"previous_response_id": None}))
    with pytest.raises(InvalidRequest) as info:
        refuse_previous_response(request({"previous_response_id": "resp_1"}))
    assert info.value.error_type == "invalid_request_error"


def test_errors_inside_input_are_reported_at_input() -> None:
    assert request_param("body.input.3.content", b"") == "body.input"
    assert request_param("body.temperature", b"") == "body.temperature"
