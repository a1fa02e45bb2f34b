"""OpenAI Responses: the request of /v1/responses/render and what Responses derender returns.

The request keeps vLLM 0.33's ``ResponsesRequest`` fields and defaults. ``input`` items and
``tools`` stay plain JSON values: vLLM validates them against the OpenAI SDK's large unions, which
``render.responses`` checks by hand (every failure there is vLLM's 400 with param ``body.input``).
Response objects and stream events follow vLLM's ``/v1/responses`` serialization.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec

from render_service.protocol._base import Body

_INT64 = msgspec.Meta(ge=-(2**63), le=2**63 - 1)
_PENALTY = msgspec.Meta(ge=-2.0, le=2.0)


class Reasoning(msgspec.Struct, kw_only=True):
    effort: Literal["none", "minimal", "low", "medium", "high", "xhigh"] | None = None
    generate_summary: Literal["auto", "concise", "detailed"] | None = None
    summary: Literal["auto", "concise", "detailed"] | None = None


class TextFormat(msgspec.Struct, kw_only=True):
    type: Literal["text", "json_schema", "json_object"]
    name: str | None = None
    schema: dict[str, Any] | None = None
    description: str | None = None
    strict: bool | None = None


class TextConfig(msgspec.Struct, kw_only=True):
    format: TextFormat | None = None
    verbosity: Literal["low", "medium", "high"] | None = None


class ResponsesRequest(Body, kw_only=True):
    """The body of /v1/responses/render; only ``input`` is required (vLLM 0.33's defaults)."""

    input: str | list[Any]
    background: bool | None = False
    include: list[str] | None = None
    instructions: str | None = None
    max_output_tokens: int | None = None
    max_tool_calls: int | None = None
    metadata: dict[str, str] | None = None
    model: str | None = None
    logit_bias: dict[str, float] | None = None
    parallel_tool_calls: bool | None = True
    previous_response_id: str | None = None
    prompt: Any = None
    reasoning: Reasoning | None = None
    include_reasoning: bool = True
    service_tier: Literal["auto", "default", "flex", "scale", "priority"] = "auto"
    store: bool | None = True
    stream: bool | None = False
    temperature: float | None = None
    text: TextConfig | None = None
    tool_choice: str | dict[str, Any] = "auto"
    tools: list[dict[str, Any]] = msgspec.field(default_factory=list)
    top_logprobs: int | None = 0
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    truncation: Literal["auto", "disabled"] | None = "disabled"
    user: str | None = None
    skip_special_tokens: bool | None = None
    spaces_between_special_tokens: bool = True
    include_stop_str_in_output: bool = False
    presence_penalty: Annotated[float, _PENALTY] | None = None
    frequency_penalty: Annotated[float, _PENALTY] | None = None
    prompt_cache_key: str | None = None
    prompt_cache_options: dict[str, Any] | None = None
    prompt_cache_retention: str | None = None
    safety_identifier: str | None = None
    watermarking: bool | None = None
    request_id: str | None = None
    session_id: str | None = None
    media_io_kwargs: dict[str, dict[str, Any]] | None = None
    mm_processor_kwargs: dict[str, Any] | None = None
    priority: Annotated[int, _INT64] = 0
    mm_payload: Literal["tensors", "none"] = "tensors"
    return_mm_kwargs: bool | None = None
    cache_salt: Annotated[str, msgspec.Meta(min_length=1, max_length=1024)] | None = None
    enable_response_messages: bool = False
    previous_input_messages: list[Any] | None = None
    structured_outputs: dict[str, Any] | None = None
    repetition_penalty: float | None = None
    seed: Annotated[int, _INT64] | None = None
    stop: str | list[str] | None = msgspec.field(default_factory=list)
    stop_token_ids: list[int] | None = msgspec.field(default_factory=list)
    ignore_eos: bool = False
    vllm_xargs: dict[str, str | int | float | list[str | int | float]] | None = None
    kv_transfer_params: dict[str, Any] | None = None
    ec_transfer_params: dict[str, Any] | None = None
    chat_template_kwargs: dict[str, Any] | None = None


# ---- what Responses derender returns ------------------------------------------------------


class ReasoningText(msgspec.Struct, tag="reasoning_text", tag_field="type", kw_only=True):
    text: str


class OutputText(msgspec.Struct, tag="output_text", tag_field="type", kw_only=True):
    text: str
    annotations: list[Any] = msgspec.field(default_factory=list)
    logprobs: list[Any] | None = None


class ReasoningItem(msgspec.Struct, tag="reasoning", tag_field="type", kw_only=True):
    id: str
    summary: list[Any] = msgspec.field(default_factory=list)
    content: list[ReasoningText] | None = None
    encrypted_content: None = None
    status: str | None = None


class MessageItem(msgspec.Struct, tag="message", tag_field="type", kw_only=True):
    id: str
    content: list[OutputText]
    role: Literal["assistant"] = "assistant"
    status: str = "completed"
    phase: None = None


class FunctionCallItem(msgspec.Struct, tag="function_call", tag_field="type", kw_only=True):
    arguments: str
    call_id: str
    name: str
    id: str
    namespace: str | None = None
    status: str = "completed"


OutputItem = ReasoningItem | MessageItem | FunctionCallItem


class InputTokensDetails(msgspec.Struct, kw_only=True):
    cached_tokens: int = 0
    cache_write_tokens: int = 0
    input_tokens_per_turn: list[int] = msgspec.field(default_factory=list)
    cached_tokens_per_turn: list[int] = msgspec.field(default_factory=list)


class OutputTokensDetails(msgspec.Struct, kw_only=True):
    reasoning_tokens: int = 0
    tool_output_tokens: int = 0
    output_tokens_per_turn: list[int] = msgspec.field(default_factory=list)
    tool_output_tokens_per_turn: list[int] = msgspec.field(default_factory=list)


class ResponseUsage(msgspec.Struct, kw_only=True):
    input_tokens: int
    output_tokens: int
    total_tokens: int
    input_tokens_details: InputTokensDetails = msgspec.field(default_factory=InputTokensDetails)
    output_tokens_details: OutputTokensDetails = msgspec.field(default_factory=OutputTokensDetails)


class ResponseEcho(msgspec.Struct, kw_only=True):
    """The request fields a response repeats, fixed when the stream starts."""

    instructions: str | None = None
    metadata: dict[str, str] | None = None
    parallel_tool_calls: bool = True
    temperature: float = 1.0
    tool_choice: str | dict[str, Any] = "auto"
    tools: list[dict[str, Any]] = msgspec.field(default_factory=list)
    top_p: float = 1.0
    background: bool = False
    max_output_tokens: int = 0
    max_tool_calls: int | None = None
    previous_response_id: str | None = None
    prompt_cache_key: str | None = None
    prompt_cache_retention: str | None = None
    reasoning: Reasoning | None = None
    safety_identifier: str | None = None
    service_tier: str = "auto"
    text: TextConfig | None = None
    top_logprobs: int | None = None
    truncation: str = "disabled"
    user: str | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None


class ResponsesResponse(msgspec.Struct, kw_only=True):
    """vLLM's ResponsesResponse (field order and nulls as it dumps them)."""

    id: str
    created_at: int
    incomplete_details: dict[str, str] | None
    instructions: str | None
    metadata: dict[str, str] | None
    model: str
    object: Literal["response"]
    output: list[OutputItem]
    parallel_tool_calls: bool
    temperature: float
    tool_choice: str | dict[str, Any]
    tools: list[dict[str, Any]]
    top_p: float
    background: bool
    max_output_tokens: int
    max_tool_calls: int | None
    previous_response_id: str | None
    prompt: None
    prompt_cache_options: None
    prompt_cache_key: str | None
    prompt_cache_retention: str | None
    reasoning: Reasoning | None
    safety_identifier: str | None
    service_tier: str
    status: str
    text: TextConfig | None
    top_logprobs: int | None
    truncation: str
    usage: ResponseUsage | None
    user: str | None
    presence_penalty: float | None
    frequency_penalty: float | None
    kv_transfer_params: dict[str, Any] | None = None
    ec_transfer_params: dict[str, Any] | None = None
    input_messages: None = None
    output_messages: None = None


# ---- stream events -------------------------------------------------------------------------


class _Event(msgspec.Struct, tag_field="type", kw_only=True):
    sequence_number: int


class ResponseCreated(_Event, tag="response.created"):
    response: ResponsesResponse


class ResponseInProgress(_Event, tag="response.in_progress"):
    response: ResponsesResponse


class ResponseCompleted(_Event, tag="response.completed"):
    response: ResponsesResponse


class ResponseIncomplete(_Event, tag="response.incomplete"):
    response: ResponsesResponse


class OutputItemAdded(_Event, tag="response.output_item.added"):
    output_index: int
    item: OutputItem


class OutputItemDone(_Event, tag="response.output_item.done"):
    output_index: int
    item: OutputItem


class ContentPartAdded(_Event, tag="response.content_part.added"):
    output_index: int
    item_id: str
    content_index: int
    part: OutputText | ReasoningText


class ContentPartDone(_Event, tag="response.content_part.done"):
    output_index: int
    item_id: str
    content_index: int
    part: OutputText | ReasoningText


class OutputTextDelta(_Event, tag="response.output_text.delta"):
    output_index: int
    item_id: str
    content_index: int
    delta: str
    logprobs: list[Any] = msgspec.field(default_factory=list)


class OutputTextDone(_Event, tag="response.output_text.done"):
    output_index: int
    item_id: str
    content_index: int
    text: str
    logprobs: list[Any] = msgspec.field(default_factory=list)


class ReasoningTextDelta(_Event, tag="response.reasoning_text.delta"):
    output_index: int
    item_id: str
    content_index: int
    delta: str


class ReasoningTextDone(_Event, tag="response.reasoning_text.done"):
    output_index: int
    item_id: str
    content_index: int
    text: str


class ArgumentsDelta(_Event, tag="response.function_call_arguments.delta"):
    output_index: int
    item_id: str
    delta: str


class ArgumentsDone(_Event, tag="response.function_call_arguments.done"):
    output_index: int
    item_id: str
    arguments: str
    name: str


StreamEvent = (
    ResponseCreated
    | ResponseInProgress
    | ResponseCompleted
    | ResponseIncomplete
    | OutputItemAdded
    | OutputItemDone
    | ContentPartAdded
    | ContentPartDone
    | OutputTextDelta
    | OutputTextDone
    | ReasoningTextDelta
    | ReasoningTextDone
    | ArgumentsDelta
    | ArgumentsDone
)


class ResponsesDerenderEvents(msgspec.Struct, kw_only=True):
    """Ours: a streaming Responses derender answer, the events and the state for the next call."""

    events: list[StreamEvent]
    stream_state: str
