"""ChatCompletionRequest: the body of /v1/chat/completions/render (vLLM contract §3.5)."""

from __future__ import annotations

from typing import Any, Literal

import msgspec

from render_service.protocol.sampling import SamplingRequest

ReasoningEffort = Literal["none", "minimal", "low", "medium", "high", "xhigh", "max"]
ToolChoice = str | dict[str, Any]


class FunctionDefinition(msgspec.Struct, kw_only=True):
    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | msgspec.UnsetType = msgspec.UNSET


class ChatCompletionTool(msgspec.Struct, kw_only=True):
    type: Literal["function"] = "function"
    function: FunctionDefinition


class ChatCompletionRequest(SamplingRequest, kw_only=True):
    """Only ``messages`` is required; defaults are vLLM 0.33's."""

    messages: list[dict[str, Any]]
    model: str | None = None
    logprobs: bool | None = False
    top_logprobs: int | None = 0
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    tools: list[ChatCompletionTool] | None = None
    tool_choice: ToolChoice | msgspec.UnsetType | None = msgspec.UNSET
    reasoning_effort: ReasoningEffort | None = None
    thinking_token_budget: int | None = None
    include_reasoning: bool = True
    parallel_tool_calls: bool | None = True
    echo: bool = False
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    add_special_tokens: bool = False
    documents: list[dict[str, str]] | None = None
    chat_template: str | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    media_io_kwargs: dict[str, dict[str, Any]] | None = None
    mm_processor_kwargs: dict[str, Any] | None = None
    mm_payload: Literal["tensors", "none"] = "tensors"
    session_id: str | None = None
