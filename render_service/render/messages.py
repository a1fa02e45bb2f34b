"""Anthropic Messages requests -> GenerateRequest: converted to chat as vLLM does, then chat render."""

from __future__ import annotations

from typing import TYPE_CHECKING

from render_service.apis import messages as api
from render_service.protocol.chat import ChatCompletionRequest
from render_service.protocol.generate import GenerateRequest
from render_service.protocol.messages import AnthropicMessagesRequest, ThinkingDisabled
from render_service.render.chat import render_chat

if TYPE_CHECKING:
    from render_service.render.renderer import Renderer


def chat_request(renderer: Renderer, request: AnthropicMessagesRequest) -> ChatCompletionRequest:
    """The chat request vLLM makes of a Messages request for this server's model."""
    api.check_request(request)
    effort = (
        renderer.template_probes.disabled_thinking_effort
        if isinstance(request.thinking, ThinkingDisabled)
        else "none"
    )
    return api.to_chat_request(
        request,
        merge_inline_system=renderer.template_probes.merge_inline_system,
        disabled_thinking_effort=effort,
    )


def render_messages(
    renderer: Renderer, request: AnthropicMessagesRequest, *, request_id: str | None = None
) -> GenerateRequest:
    """A Messages request rendered as vLLM renders it (``chatcmpl-`` ids, chat's parse context)."""
    chat = chat_request(renderer, request)
    return render_chat(renderer, chat, request_id=request_id, converted=True)
