"""Anthropic Messages: the request of /v1/messages/render and the objects Messages derender returns.

Requests follow vLLM 0.33's ``AnthropicMessagesRequest`` (its extra vLLM fields included); responses
and stream events follow Anthropic's Messages API as vLLM's ``/v1/messages`` serializes them.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec

from render_service.protocol._base import Body

BlockType = Literal[
    "text",
    "image",
    "tool_use",
    "tool_result",
    "tool_reference",
    "thinking",
    "redacted_thinking",
    "tool_addition",
    "tool_removal",
]
Effort = Literal["low", "medium", "high", "xhigh", "max"]
StopReason = Literal["end_turn", "max_tokens", "stop_sequence", "tool_use"]


class AnthropicTool(msgspec.Struct, kw_only=True):
    name: str
    input_schema: dict[str, Any]
    description: str | None = None
    strict: bool | None = None
    defer_loading: bool | None = None


class ToolReference(msgspec.Struct, tag="tool_reference", tag_field="type", kw_only=True):
    name: str


class ToolDefinition(msgspec.Struct, tag="tool_definition", tag_field="type", kw_only=True):
    definition: AnthropicTool


class ContentBlock(msgspec.Struct, kw_only=True):
    """One block of a message or of ``system``: vLLM keeps every kind in one model."""

    type: BlockType
    text: str | None = None
    source: dict[str, Any] | None = None
    id: str | None = None
    tool_use_id: str | None = None
    name: str | None = None
    input: dict[str, Any] | None = None
    content: str | list[dict[str, Any]] | None = None
    is_error: bool | None = None
    tool_name: str | None = None
    thinking: str | None = None
    signature: str | None = None
    data: str | None = None
    tool: ToolReference | ToolDefinition | None = None


class AnthropicMessage(msgspec.Struct, kw_only=True):
    role: Literal["user", "assistant", "system"]
    content: str | list[ContentBlock]


class ToolChoice(msgspec.Struct, kw_only=True):
    type: Literal["auto", "any", "tool", "none"]
    name: str | None = None
    disable_parallel_tool_use: bool | None = None


class JsonOutputFormat(msgspec.Struct, kw_only=True):
    type: Literal["json_schema"] = "json_schema"
    schema: dict[str, Any] | None = None


class OutputConfig(msgspec.Struct, kw_only=True):
    effort: Effort | None = None
    format: JsonOutputFormat | None = None


class ThinkingEnabled(msgspec.Struct, tag="enabled", tag_field="type", kw_only=True):
    budget_tokens: Annotated[int, msgspec.Meta(ge=1024)]
    display: Literal["summarized", "omitted", "updates"] | None = None


class ThinkingDisabled(msgspec.Struct, tag="disabled", tag_field="type", kw_only=True):
    pass


class ThinkingAdaptive(msgspec.Struct, tag="adaptive", tag_field="type", kw_only=True):
    display: Literal["summarized", "omitted", "updates"] | None = None


Thinking = ThinkingEnabled | ThinkingDisabled | ThinkingAdaptive


class AnthropicMessagesRequest(Body, kw_only=True):
    """The body of /v1/messages/render (vLLM's model, its non-Anthropic fields included)."""

    model: str
    messages: list[AnthropicMessage]
    max_tokens: int
    metadata: dict[str, Any] | None = None
    output_config: OutputConfig | None = None
    thinking: Thinking | None = None
    stop_sequences: Annotated[list[str], msgspec.Meta(max_length=4)] | None = None
    stream: bool | None = False
    system: str | list[ContentBlock] | None = None
    temperature: float | None = None
    tool_choice: ToolChoice | None = None
    tools: list[AnthropicTool] | None = None
    top_k: int | None = None
    top_p: float | None = None
    mm_payload: Literal["tensors", "none"] = "tensors"
    return_mm_kwargs: bool | None = None
    cache_salt: Annotated[str, msgspec.Meta(min_length=1, max_length=1024)] | None = None
    watermarking: bool | None = None
    kv_transfer_params: dict[str, Any] | None = None
    ec_transfer_params: dict[str, Any] | None = None
    vllm_xargs: dict[str, str | int | float | list[str | int | float]] | None = None
    chat_template_kwargs: dict[str, Any] | None = None


# ---- what Messages derender returns ---------------------------------------------------------


class Usage(msgspec.Struct, kw_only=True, omit_defaults=True):
    input_tokens: int
    output_tokens: int


class TextBlock(msgspec.Struct, tag="text", tag_field="type", kw_only=True):
    text: str


class ThinkingBlock(msgspec.Struct, tag="thinking", tag_field="type", kw_only=True):
    thinking: str
    signature: str | msgspec.UnsetType = msgspec.UNSET


class ToolUseBlock(msgspec.Struct, tag="tool_use", tag_field="type", kw_only=True):
    id: str
    name: str
    input: dict[str, Any] | msgspec.Raw


ResponseBlock = TextBlock | ThinkingBlock | ToolUseBlock


class MessagesResponse(msgspec.Struct, kw_only=True, omit_defaults=True):
    """vLLM's AnthropicMessagesResponse, dumped with exclude_none (null fields left out)."""

    id: str
    content: list[ResponseBlock]
    model: str
    type: Literal["message"] = "message"
    role: Literal["assistant"] = "assistant"
    stop_reason: StopReason | None = None
    stop_sequence: str | None = None
    usage: Usage | None = None
    kv_transfer_params: dict[str, Any] | None = None


class StartMessage(msgspec.Struct, kw_only=True):
    """The message of ``message_start``: stop fields present and null, as Anthropic sends them."""

    id: str
    model: str
    usage: Usage
    type: Literal["message"] = "message"
    role: Literal["assistant"] = "assistant"
    content: list[ResponseBlock] = msgspec.field(default_factory=list)
    stop_reason: None = None
    stop_sequence: None = None


class MessageStart(msgspec.Struct, tag="message_start", tag_field="type", kw_only=True):
    message: StartMessage


class BlockStart(msgspec.Struct, tag="content_block_start", tag_field="type", kw_only=True):
    index: int
    content_block: ResponseBlock


class TextDelta(msgspec.Struct, tag="text_delta", tag_field="type", kw_only=True):
    text: str


class ThinkingDelta(msgspec.Struct, tag="thinking_delta", tag_field="type", kw_only=True):
    thinking: str


class SignatureDelta(msgspec.Struct, tag="signature_delta", tag_field="type", kw_only=True):
    signature: str


class InputJsonDelta(msgspec.Struct, tag="input_json_delta", tag_field="type", kw_only=True):
    partial_json: str


class BlockDelta(msgspec.Struct, tag="content_block_delta", tag_field="type", kw_only=True):
    index: int
    delta: TextDelta | ThinkingDelta | SignatureDelta | InputJsonDelta


class BlockStop(msgspec.Struct, tag="content_block_stop", tag_field="type", kw_only=True):
    index: int


class StopDelta(msgspec.Struct, kw_only=True):
    stop_reason: StopReason | None
    stop_sequence: str | None = None


class MessageDelta(msgspec.Struct, tag="message_delta", tag_field="type", kw_only=True):
    delta: StopDelta
    usage: Usage


class MessageStop(msgspec.Struct, tag="message_stop", tag_field="type", kw_only=True):
    pass


StreamEvent = MessageStart | BlockStart | BlockDelta | BlockStop | MessageDelta | MessageStop


class MessagesDerenderEvents(msgspec.Struct, kw_only=True):
    """Ours: a streaming Messages derender answer, the events and the state for the next call."""

    events: list[StreamEvent]
    stream_state: str
