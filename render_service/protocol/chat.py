"""Chat: the body of /v1/chat/completions/render (vLLM contract §3.5) and the ChatCompletion and
chunk that chat derender answers with (§5), fields in vLLM's order."""

from __future__ import annotations

from typing import Any, Literal

import msgspec

from render_service.protocol.logprobs import ChatCompletionLogProbs
from render_service.protocol.sampling import SamplingRequest
from render_service.protocol.usage import UsageInfo

#: Content-part types that carry an image (OpenAI's and vLLM's spellings).
IMAGE_PART_TYPES = frozenset({"image_url", "input_image", "image", "image_pil", "image_embeds"})
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


class FunctionCall(msgspec.Struct, kw_only=True):
    name: str
    arguments: str


class ToolCall(msgspec.Struct, kw_only=True):
    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class ChatMessage(msgspec.Struct, kw_only=True):
    """The assistant message of a ChatCompletion choice; ``tool_calls`` only when there are some."""

    role: Literal["assistant"] = "assistant"
    content: str | None = None
    refusal: None = None
    annotations: None = None
    audio: None = None
    function_call: None = None
    tool_calls: list[ToolCall] | msgspec.UnsetType = msgspec.UNSET
    reasoning: str | None = None


class ChatCompletionResponseChoice(msgspec.Struct, kw_only=True):
    index: int
    message: ChatMessage
    logprobs: ChatCompletionLogProbs | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    token_ids: list[int] | None = None
    routed_experts: None = None
    weight_versions: None = None


class ChatCompletionResponse(msgspec.Struct, kw_only=True):
    """A non-streaming chat completion (batch derender)."""

    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[ChatCompletionResponseChoice]
    service_tier: None = None
    system_fingerprint: None = None
    usage: UsageInfo
    prompt_logprobs: Any = None
    prompt_token_ids: list[int] | None = None
    prompt_text: None = None
    kv_transfer_params: dict[str, Any] | None = None
    ec_transfer_params: None = None
    metrics: Any = None


class DeltaFunctionCall(msgspec.Struct, kw_only=True):
    name: str | None = None
    arguments: str | None = None


class DeltaToolCall(msgspec.Struct, kw_only=True):
    """A tool call's start (id, type, name) or a piece of its arguments (id and type null)."""

    id: str | None = None
    type: Literal["function"] | None = None
    index: int
    function: DeltaFunctionCall


class DeltaMessage(msgspec.Struct, kw_only=True):
    """A chunk's delta; ``tool_calls`` only when there are some."""

    role: Literal["assistant"] | None = None
    content: str | None = None
    reasoning: str | None = None
    tool_calls: list[DeltaToolCall] | msgspec.UnsetType = msgspec.UNSET


class ChatCompletionResponseStreamChoice(msgspec.Struct, kw_only=True):
    index: int
    delta: DeltaMessage
    logprobs: ChatCompletionLogProbs | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    token_ids: list[int] | None = None
    weight_versions: list[dict[str, Any]] | None = None


class ChatCompletionStreamResponse(msgspec.Struct, kw_only=True):
    """One chunk of a streamed chat completion (streaming derender)."""

    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChatCompletionResponseStreamChoice]
    usage: UsageInfo | None = None
    system_fingerprint: None = None
    prompt_token_ids: list[int] | None = None
    prompt_text: None = None
    metrics: Any = None
    kv_transfer_params: None = None
