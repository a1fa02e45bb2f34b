"""Chat templating: the conversation a template receives."""

from __future__ import annotations

import functools
from typing import Any

import pytest

from render_service.errors import InvalidRequest
from render_service.model.templating import apply_template, build_conversation


def test_conversation_keeps_only_the_fields_vllm_passes_to_templates() -> None:
    # DeepSeek-V3.1's template reads an assistant `prefix`; vLLM never passes it, so a final
    # assistant message with prefix=true renders as if it had none (golden
    # deepseek-v3.1/render/ds_prefix_assistant_thinking).
    messages = [
        {"role": "user", "content": "Q", "name": "ann", "prefix": True},
        {"role": "assistant", "content": "A", "prefix": True, "reasoning_content": "R"},
        {"role": "tool", "content": "T", "tool_call_id": "c1", "name": 3},
    ]
    convo = build_conversation(messages, "string", False)
    assert convo == [
        {"role": "user", "content": "Q", "name": "ann"},
        {"role": "assistant", "content": "A", "reasoning": "R", "reasoning_content": "R"},
        {"role": "tool", "content": "T", "tool_call_id": "c1"},
    ]


def test_too_deeply_nested_tool_call_arguments_are_a_400_not_a_crash() -> None:
    deep = "[" * 100_000 + "]" * 100_000
    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": deep}}
    messages = [{"role": "assistant", "content": "", "tool_calls": [call]}]
    with pytest.raises(InvalidRequest, match="nested too deeply"):
        build_conversation(messages, "string", False)


DEEP = functools.reduce(lambda inner, _: [inner], range(5000), [])


@pytest.mark.parametrize(
    ("template", "tools"),
    [
        ("{{ 1 // (messages | length - 1) }}", None),  # arithmetic on request values
        ("{{ tools | tojson }}", [{"type": "function", "function": {"name": "f", "x": DEEP}}]),
    ],
    ids=["division-by-zero", "deep-tools"],
)
def test_a_template_failing_on_request_values_is_a_400(
    template: str, tools: list[Any] | None
) -> None:
    conversation = [{"role": "user", "content": "hi"}]
    with pytest.raises(InvalidRequest, match="chat template failed"):
        apply_template({}, template, conversation, tools, {})
