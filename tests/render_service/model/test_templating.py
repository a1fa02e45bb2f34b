"""Chat templating: the conversation a template receives."""

from __future__ import annotations

from render_service.model.templating import build_conversation


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
