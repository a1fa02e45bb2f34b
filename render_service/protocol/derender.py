"""Bodies of the derender endpoints: vLLM's generate responses in, OpenAI responses out (§4, §5)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec

from render_service.protocol._base import Body
from render_service.protocol.chat import ChatCompletionStreamResponse
from render_service.protocol.completions import CompletionStreamResponse
from render_service.protocol.logprobs import GenerateLogProbs
from render_service.protocol.server import ErrorInfo

# Ids are 32-bit in every tokenizer and engine; a larger one is refused at the schema (vLLM would
# decode it to nothing, but our parser cache digests ids as uint32).
TokenId = Annotated[int, msgspec.Meta(ge=0, lt=2**32)]
# A choice index seeds the stream digest as uint32 (a negative one was a 500, found by schemathesis).
ChoiceIndex = Annotated[int, msgspec.Meta(ge=0, lt=2**32)]


class GenerateChoice(msgspec.Struct, kw_only=True):
    """A choice of a non-streaming generate answer: without ``finish_reason`` it finished with
    "stop" (vLLM's GenerateChoiceBase default, the OpenAI one)."""

    index: ChoiceIndex = 0
    finish_reason: str | None = "stop"
    stop_reason: int | str | None = None
    token_ids: list[TokenId] | None = None
    logprobs: GenerateLogProbs | None = None
    routed_experts: str | None = None
    sampling_mask: list[list[int]] | None = None
    weight_versions: list[dict[str, Any]] | None = None


class GenerateStreamChoice(GenerateChoice, kw_only=True):
    """A choice of one generate SSE event: without ``finish_reason`` the stream goes on (vLLM's
    GenerateStreamChoiceBase defaults it to null)."""

    finish_reason: str | None = None


class GenerateResponse(msgspec.Struct, kw_only=True):
    """A non-streaming /inference/v1/generate answer (``output_mode`` must be "tokens")."""

    request_id: str
    choices: list[GenerateChoice]
    model: str | None = None
    created: int | None = None
    output_mode: Literal["tokens"] = "tokens"
    usage: dict[str, Any] | None = None
    prompt_logprobs: Any = None
    prompt_token_ids: list[TokenId] | None = None
    metrics: Any = None
    kv_transfer_params: dict[str, Any] | None = None
    ec_transfer_params: dict[str, Any] | None = None


class GenerateChunk(msgspec.Struct, kw_only=True):
    """One SSE payload of a streaming /inference/v1/generate answer."""

    request_id: str
    choices: list[GenerateStreamChoice]
    usage: dict[str, Any] | None = None
    output_mode: Literal["tokens"] = "tokens"
    prompt_token_ids: list[TokenId] | None = None
    metrics: Any = None


class DerenderChatRequest(Body, kw_only=True):
    stream: Literal[False] = False
    model: str | None = None
    generate_response: GenerateResponse
    prompt_tokens: int | None = None
    prompt_token_ids: list[TokenId] | None = None
    chat_request: dict[str, Any] | None = None


class DerenderChatStreamRequest(Body, kw_only=True):
    """One generate chunk plus the state the previous call returned (None on the first call).

    Lean protocol: once a state is carried, ``prompt_token_ids`` and ``chat_request`` may be left out.
    """

    stream: Literal[True]
    generate_chunk: GenerateChunk | None = None
    model: str | None = None
    stream_state: Any = None
    prompt_tokens: int | None = None
    prompt_token_ids: list[TokenId] | None = None
    chat_request: dict[str, Any] | None = None
    #: Ours: several generate chunks of one choice, in order, in one call.
    generate_chunks: list[GenerateChunk] | None = None
    #: Ours: on a stream's first call, render's ``derender_seed`` instead of
    #: ``prompt_token_ids`` and ``chat_request``.
    derender_seed: str | None = None


# A raw field: any JSON (or msgpack) value, kept undecoded; unset when the body left it out.
RawField = msgspec.Raw | msgspec.UnsetType


class DerenderChatStreamWire(Body, kw_only=True):
    """``DerenderChatStreamRequest`` as the HTTP layer decodes it: ``prompt_token_ids`` and
    ``chat_request`` stay raw JSON until a call needs them (render_service.derender.inputs).
    Same fields (a test holds them equal)."""

    stream: Literal[True]
    generate_chunk: GenerateChunk | None = None
    model: str | None = None
    stream_state: Any = None
    prompt_tokens: int | None = None
    prompt_token_ids: RawField = msgspec.UNSET
    chat_request: RawField = msgspec.UNSET
    generate_chunks: list[GenerateChunk] | None = None
    derender_seed: str | None = None


class DerenderStreamItem(Body, kw_only=True):
    """One stream's call in a multi-stream derender: a single-stream body without ``stream``
    and ``model``. Its ``prompt_token_ids`` and ``chat_request`` are any JSON, validated as a
    single-stream call validates them."""

    generate_chunk: GenerateChunk
    stream_state: Any = None
    prompt_tokens: int | None = None
    prompt_token_ids: RawField = msgspec.UNSET
    chat_request: RawField = msgspec.UNSET
    derender_seed: str | None = None


class DerenderChatStreamsRequest(Body, kw_only=True):
    """Ours: one engine step's chunks for many streams, each item independent and answered in
    order (``POST /v1/chat/completions/derender/streams``)."""

    model: str | None = None
    items: list[DerenderStreamItem]


class DerenderCompletionRequest(Body, kw_only=True):
    stream: Literal[False] = False
    model: str | None = None
    generate_responses: list[GenerateResponse]
    prompt_tokens: list[int] | None = None
    prompt_token_ids: list[list[TokenId] | None] | None = None
    completion_request: dict[str, Any] | None = None


class DerenderCompletionStreamRequest(Body, kw_only=True):
    stream: Literal[True]
    generate_chunk: GenerateChunk
    model: str | None = None
    stream_state: Any = None
    prompt_tokens: int | None = None
    prompt_token_ids: list[TokenId] | None = None
    completion_request: dict[str, Any] | None = None


class VllmStreamState(msgspec.Struct, kw_only=True):
    """vLLM 0.33's own client-held state, accepted from clients switching over (history replayed)."""

    prev_tokens: list[str] = msgspec.field(default_factory=list)
    prefix_offset: Annotated[int, msgspec.Meta(ge=0)] = 0
    read_offset: Annotated[int, msgspec.Meta(ge=0)] = 0
    role_sent: bool = False
    logprob_context_token_ids: Annotated[list[int], msgspec.Meta(max_length=4)] = msgspec.field(
        default_factory=list
    )
    logprob_text_offset: Annotated[int, msgspec.Meta(ge=0)] = 0
    output_token_ids: list[TokenId] = msgspec.field(default_factory=list)
    output_chunk_lens: list[Annotated[int, msgspec.Meta(gt=0)]] = msgspec.field(
        default_factory=list
    )
    tools_streamed: bool = False
    last_tool_call_ids: list[str] = msgspec.field(default_factory=list)


class ChatDerenderChunk(msgspec.Struct, kw_only=True):
    """A streaming chat derender answer: the chunk and the state to send with the next call.

    ``stream_state`` is our signed token, or what the client sent when the chunk had no choice.
    """

    chunk: ChatCompletionStreamResponse
    stream_state: Any = None


class ChatDerenderChunks(msgspec.Struct, kw_only=True):
    """Ours: the answer to ``generate_chunks``, one derendered chunk each and the final state."""

    chunks: list[ChatCompletionStreamResponse]
    stream_state: Any = None


class StreamResult(msgspec.Struct, kw_only=True):
    """One item's answer in a multi-stream derender: its chunk and next ``stream_state``, or,
    for an item that failed, only ``error`` (what a single-stream call would have answered)."""

    chunk: ChatCompletionStreamResponse | msgspec.UnsetType = msgspec.UNSET
    stream_state: Any = msgspec.UNSET
    error: ErrorInfo | msgspec.UnsetType = msgspec.UNSET


class ChatDerenderStreams(msgspec.Struct, kw_only=True):
    """The answer to a multi-stream derender: one result per item, in order."""

    items: list[StreamResult]


class CompletionDerenderChunk(msgspec.Struct, kw_only=True):
    """A streaming completions derender answer: the chunk and the state for the next call."""

    chunk: CompletionStreamResponse
    stream_state: Any = None


class _ApiDerender(Body, kw_only=True):
    model: str | None = None
    prompt_tokens: int | None = None
    prompt_token_ids: list[TokenId] | None = None


class DerenderMessagesRequest(_ApiDerender, kw_only=True):
    """Ours: a generate answer back into an Anthropic Messages response."""

    stream: Literal[False] = False
    generate_response: GenerateResponse
    messages_request: dict[str, Any] | None = None


class DerenderMessagesStreamRequest(_ApiDerender, kw_only=True):
    """Ours: generate chunks into Messages stream events; lean after the first call."""

    stream: Literal[True]
    generate_chunk: GenerateChunk | None = None
    generate_chunks: list[GenerateChunk] | None = None
    stream_state: str | None = None
    messages_request: dict[str, Any] | None = None


class DerenderResponsesRequest(_ApiDerender, kw_only=True):
    """Ours: a generate answer back into an OpenAI Responses response."""

    stream: Literal[False] = False
    generate_response: GenerateResponse
    responses_request: dict[str, Any] | None = None


class DerenderResponsesStreamRequest(_ApiDerender, kw_only=True):
    """Ours: generate chunks into Responses stream events; lean after the first call."""

    stream: Literal[True]
    generate_chunk: GenerateChunk | None = None
    generate_chunks: list[GenerateChunk] | None = None
    stream_state: str | None = None
    responses_request: dict[str, Any] | None = None
