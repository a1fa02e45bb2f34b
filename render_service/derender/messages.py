"""Messages derender (ours; vLLM has none): chat derender results as Anthropic Messages objects.

Batch: the request is converted to the chat request vLLM would render, the output derendered as
chat, and the message rebuilt as an Anthropic ``Message``. Streaming: each call runs the chat
stream machine (same parser state, cache and lean protocol) and feeds its delta to the Messages
event machine below.

The stream machine is a value: ``MessagesStream`` holds which block is open and how far the
message got (a few integers), so it rides in the signed stream state at constant size. Event
shapes follow vLLM 0.33's ``/v1/messages`` (``message_stream_converter``) and Anthropic's API:
``message_start``; per block ``content_block_start`` / ``_delta`` (``thinking_delta`` then a
``signature_delta``, ``text_delta``, ``input_json_delta``) / ``_stop``; ``message_delta`` with
``stop_reason``; ``message_stop``. Signatures and tool-use ids are deterministic.
"""

from __future__ import annotations

import hashlib
from typing import TYPE_CHECKING, Any

import msgspec

from render_service.apis import messages as api
from render_service.derender import api_streams
from render_service.derender.chat import stream_chunks
from render_service.errors import InvalidRequest
from render_service.protocol.derender import (
    DerenderChatRequest,
    DerenderMessagesRequest,
    DerenderMessagesStreamRequest,
)
from render_service.protocol.messages import (
    AnthropicMessagesRequest,
    BlockDelta,
    BlockStart,
    BlockStop,
    InputJsonDelta,
    MessageDelta,
    MessagesDerenderEvents,
    MessagesResponse,
    MessageStart,
    MessageStop,
    ResponseBlock,
    SignatureDelta,
    StartMessage,
    StopDelta,
    StreamEvent,
    TextBlock,
    TextDelta,
    ThinkingBlock,
    ThinkingDelta,
    ThinkingDisabled,
    ToolUseBlock,
    Usage,
)
from render_service.validation import convert

if TYPE_CHECKING:
    from render_service.derender.derenderer import Derenderer

__all__ = [
    "MessagesStream",
    "anthropic_stop",
    "derender_messages",
    "derender_messages_stream",
    "message_response",
    "step",
]

_NONE, _THINKING, _TEXT, _TOOL = 0, 1, 2, 3


class MessagesStream(msgspec.Struct, frozen=True, array_like=True, gc=False):
    """Between calls: the open block (kind, index, tool index), never the text.

    New fields go last with defaults.
    """

    message_id: str
    prompt_tokens: int
    started: bool = False
    finished: bool = False
    #: Index of the open block, or of the next one when none is open.
    index: int = 0
    kind: int = _NONE
    tool_index: int = -1
    tool_used: bool = False
    output_tokens: int = 0


def signature(message_id: str, index: int) -> str:
    """A thinking block's signature: opaque to clients, the same in batch and stream."""
    return hashlib.sha256(f"{message_id}\x1fthinking\x1f{index}".encode()).hexdigest()[:32]


def anthropic_stop(
    finish_reason: str | None, stop_reason: int | str | None, tool_used: bool, tool_complete: bool
) -> tuple[str | None, str | None]:
    """vLLM's (stop_reason, stop_sequence) for an OpenAI finish reason.

    ``max_tokens`` wins; a matched stop string wins unless the tool calls are complete.
    """
    if finish_reason == "length":
        return "max_tokens", None
    if finish_reason not in ("stop", "tool_calls"):
        return None, None
    if tool_complete:
        return "tool_use", None
    if isinstance(stop_reason, str):
        return "stop_sequence", stop_reason
    if finish_reason == "tool_calls" or tool_used:
        return "tool_use", None
    return "end_turn", None


def _tool_input(arguments: str) -> dict[str, Any]:
    """A call's arguments as the input object; {} when they are not a JSON object (cut short)."""
    try:
        value = msgspec.json.decode(arguments)
    except msgspec.DecodeError:
        return {}
    return value if isinstance(value, dict) else {}


def message_response(chat: dict[str, Any]) -> MessagesResponse:
    """vLLM's messages_full_converter over our chat derender answer (first choice)."""
    choice = chat["choices"][0]
    message = choice["message"]
    calls = message.get("tool_calls") or []
    stop, sequence = anthropic_stop(
        choice["finish_reason"], choice["stop_reason"], bool(calls), bool(calls)
    )
    content: list[ResponseBlock] = []
    if message.get("reasoning"):
        content.append(
            ThinkingBlock(thinking=message["reasoning"], signature=signature(chat["id"], 0))
        )
    if message.get("content"):
        content.append(TextBlock(text=message["content"]))
    for call in calls:
        function = call["function"]
        content.append(
            ToolUseBlock(
                id=call["id"], name=function["name"], input=_tool_input(function["arguments"])
            )
        )
    if not content:  # Anthropic's shape for an empty answer is one empty text block
        content.append(TextBlock(text=""))
    usage = chat["usage"]
    return MessagesResponse(
        id=chat["id"],
        content=content,
        model=chat["model"],
        stop_reason=stop,  # type: ignore[arg-type]
        stop_sequence=sequence,
        usage=Usage(input_tokens=usage["prompt_tokens"], output_tokens=usage["completion_tokens"]),
        kv_transfer_params=chat.get("kv_transfer_params"),
    )


def _close(state: MessagesStream, events: list[StreamEvent]) -> MessagesStream:
    if state.kind == _NONE:
        return state
    if state.kind == _THINKING:
        sig = SignatureDelta(signature=signature(state.message_id, state.index))
        events.append(BlockDelta(index=state.index, delta=sig))
    events.append(BlockStop(index=state.index))
    return msgspec.structs.replace(state, kind=_NONE, index=state.index + 1, tool_index=-1)


def _open(
    state: MessagesStream, kind: int, block: ResponseBlock, events: list[StreamEvent]
) -> MessagesStream:
    state = _close(state, events)
    events.append(BlockStart(index=state.index, content_block=block))
    return msgspec.structs.replace(state, kind=kind)


def step(
    state: MessagesStream,
    model: str,
    delta: dict[str, Any] | None,
    finish_reason: str | None,
    stop_reason: int | str | None,
    new_tokens: int,
) -> tuple[MessagesStream, list[StreamEvent]]:
    """One chat stream delta (None for a usage-only chunk) -> the Messages events it makes."""
    events: list[StreamEvent] = []
    if state.finished:
        return state, events
    if not state.started:
        usage = Usage(input_tokens=state.prompt_tokens, output_tokens=0)
        start = StartMessage(id=state.message_id, model=model, usage=usage)
        events.append(MessageStart(message=start))
        state = msgspec.structs.replace(state, started=True)
    state = msgspec.structs.replace(state, output_tokens=state.output_tokens + new_tokens)
    if delta is not None:
        state = _delta_events(state, delta, events)
    if finish_reason is not None:
        state = _close(state, events)
        stop, sequence = anthropic_stop(finish_reason, stop_reason, state.tool_used, False)
        usage = Usage(input_tokens=state.prompt_tokens, output_tokens=state.output_tokens)
        events.append(
            MessageDelta(delta=StopDelta(stop_reason=stop, stop_sequence=sequence), usage=usage)  # type: ignore[arg-type]
        )
        events.append(MessageStop())
        state = msgspec.structs.replace(state, finished=True)
    return state, events


def _delta_events(
    state: MessagesStream, delta: dict[str, Any], events: list[StreamEvent]
) -> MessagesStream:
    reasoning = delta.get("reasoning")
    if reasoning:
        if state.kind != _THINKING:
            state = _open(state, _THINKING, ThinkingBlock(thinking=""), events)
        events.append(BlockDelta(index=state.index, delta=ThinkingDelta(thinking=reasoning)))
    content = delta.get("content")
    if content:
        if state.kind != _TEXT:
            state = _open(state, _TEXT, TextBlock(text=""), events)
        events.append(BlockDelta(index=state.index, delta=TextDelta(text=content)))
    for call in delta.get("tool_calls") or []:
        function = call.get("function") or {}
        if call.get("id") is not None and function.get("name") is not None:
            block = ToolUseBlock(id=call["id"], name=function["name"], input={})
            state = _open(state, _TOOL, block, events)
            state = msgspec.structs.replace(state, tool_index=call["index"], tool_used=True)
        arguments = function.get("arguments")
        if arguments and state.kind == _TOOL and call["index"] == state.tool_index:
            events.append(
                BlockDelta(index=state.index, delta=InputJsonDelta(partial_json=arguments))
            )
    return state


# ---- the endpoint ---------------------------------------------------------------------------


def _chat_request(d: Derenderer, raw: dict[str, Any] | None) -> dict[str, Any] | None:
    """The chat request (as JSON) vLLM renders for a Messages request: its parse options."""
    if raw is None:
        if d.machine.has_parser:
            raise InvalidRequest(api_streams.MISSING_REQUEST.format(field="messages_request"))
        return None
    request = convert(raw, AnthropicMessagesRequest, "body.messages_request")
    api.check_request(request)
    effort = (
        d.template_probes.disabled_thinking_effort
        if isinstance(request.thinking, ThinkingDisabled)
        else "none"
    )
    chat = api.to_chat_request(
        request,
        merge_inline_system=d.template_probes.merge_inline_system,
        disabled_thinking_effort=effort,
    )
    return msgspec.to_builtins(chat)  # type: ignore[no-any-return]


def derender_messages(d: Derenderer, body: DerenderMessagesRequest) -> MessagesResponse:
    """A generate answer as an Anthropic Messages response (vLLM's messages_full_converter)."""
    chat = api_streams.as_builtins(
        d.derender_chat(
            DerenderChatRequest(
                model=body.model,
                generate_response=body.generate_response,
                prompt_tokens=api_streams.prompt_tokens(body.prompt_tokens, body.prompt_token_ids),
                prompt_token_ids=body.prompt_token_ids,
                chat_request=_chat_request(d, body.messages_request),
            )
        )
    )
    return message_response(chat)


def derender_messages_stream(
    d: Derenderer, body: DerenderMessagesStreamRequest
) -> MessagesDerenderEvents:
    """Generate chunks -> ``{"events": [...], "stream_state": ...}`` of Messages stream events."""
    chunks = stream_chunks(body.generate_chunk, body.generate_chunks)
    chat_token, state = api_streams.split_state(
        d.streams.codecs["messages"], body.stream_state, MessagesStream
    )
    chat_request = _chat_request(d, body.messages_request) if state is None else None
    outs, chat_state = api_streams.chat_stream(
        d, body, chunks, chat_token, chat_request, "messages"
    )
    if state is None:
        state = MessagesStream(
            message_id=chunks[0].request_id,
            prompt_tokens=api_streams.prompt_tokens(body.prompt_tokens, body.prompt_token_ids),
        )
    model = body.model or d.model_name
    events: list[StreamEvent] = []
    for chunk, out in zip(chunks, outs, strict=True):
        delta, finish, stop = api_streams.chat_delta(out)
        new_tokens = len(api_streams.chunk_ids(chunk))
        state, more = step(state, model, delta, finish, stop, new_tokens)
        events.extend(more)
    token = api_streams.join_state(d.streams.codecs["messages"], chat_state, state)
    return MessagesDerenderEvents(events=events, stream_state=token)
