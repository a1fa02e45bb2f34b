"""Responses derender (ours; vLLM has none): chat derender results as OpenAI Responses objects.

Batch and streaming run the chat machine as Messages derender does (``derender.messages``); the
Responses request supplies the parse options (``apis.responses.parse_chat_request``) and the
fields a response repeats (``ResponseEcho``).

Event shapes follow vLLM 0.33's simple (non-Harmony) ``/v1/responses`` stream: ``response.created``
and ``response.in_progress``; per output item ``response.output_item.added``, a content part
(``response.content_part.added``) with ``response.reasoning_text.delta`` / ``response.output_text.delta``
or ``response.function_call_arguments.delta``, then the matching ``.done`` events and
``response.output_item.done``; finally ``response.completed`` (``response.incomplete`` when cut by
the token limit) with the whole response.

The done events and the final response repeat every item's full text, as the Responses format
requires, so unlike the chat and Messages states this state carries the output text so far.
Item ids are derived from the response id and the item's position, so batch and stream agree.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import msgspec

from parsers import ParseRequest
from render_service.apis import responses as api
from render_service.derender import api_streams
from render_service.derender.chat import stream_chunks
from render_service.errors import InvalidRequest
from render_service.protocol.derender import (
    DerenderChatRequest,
    DerenderResponsesRequest,
    DerenderResponsesStreamRequest,
)
from render_service.protocol.responses import (
    ArgumentsDelta,
    ArgumentsDone,
    ContentPartAdded,
    ContentPartDone,
    FunctionCallItem,
    MessageItem,
    OutputItem,
    OutputItemAdded,
    OutputItemDone,
    OutputText,
    OutputTextDelta,
    OutputTextDone,
    OutputTokensDetails,
    ReasoningItem,
    ReasoningText,
    ReasoningTextDelta,
    ReasoningTextDone,
    ResponseCompleted,
    ResponseCreated,
    ResponseEcho,
    ResponseIncomplete,
    ResponseInProgress,
    ResponsesDerenderEvents,
    ResponsesRequest,
    ResponsesResponse,
    ResponseUsage,
    StreamEvent,
)
from render_service.validation import convert

if TYPE_CHECKING:
    from render_service.derender.derenderer import Derenderer

__all__ = [
    "ResponsesStream",
    "derender_responses",
    "derender_responses_stream",
    "item_id",
    "response_object",
    "step",
]

_NONE, _REASONING, _MESSAGE, _CALL = 0, 1, 2, 3
_PREFIX = {_REASONING: "rs", _MESSAGE: "msg", _CALL: "fc"}


class ResponsesStream(msgspec.Struct, frozen=True, array_like=True):
    """Between calls: the open item and its text, the finished items, counters.

    New fields go last with defaults.
    """

    response_id: str
    model: str
    created_at: int
    prompt_tokens: int
    echo: ResponseEcho
    started: bool = False
    finished: bool = False
    sequence: int = 0
    kind: int = _NONE
    text: str = ""
    call_index: int = -1
    call_name: str = ""
    call_id: str = ""
    done: tuple[OutputItem, ...] = ()
    output_tokens: int = 0
    reasoning_tokens: int = 0
    #: Open reasoning blocks at the end of the output so far (vLLM's reasoning token count).
    reasoning_depth: int = 0


def item_id(response_id: str, kind: int, position: int) -> str:
    """``rs_``/``msg_``/``fc_`` + 16 hex digits of (response, position): stable across retries."""
    digest = hashlib.sha256(f"{response_id}\x1f{position}".encode()).hexdigest()[:16]
    return f"{_PREFIX[kind]}_{digest}"


def _status(finish_reason: str | None) -> str:
    return "incomplete" if finish_reason == "length" else "completed"


def _split_name(name: str, tools: list[dict[str, Any]]) -> tuple[str, str | None]:
    """A flat ``<namespace>__<name>`` call name back into its name and namespace."""
    for tool in tools:
        if tool.get("type") != "namespace":
            continue
        prefix = f"{tool.get('name')}__"
        if name.startswith(prefix) and any(
            isinstance(m, dict) and m.get("name") == name[len(prefix) :]
            for m in tool.get("tools") or []
        ):
            return name[len(prefix) :], str(tool.get("name"))
    return name, None


def _call_item(
    position: int,
    response_id: str,
    call_id: str,
    name: str,
    arguments: str,
    status: str,
    echo: ResponseEcho,
) -> FunctionCallItem:
    local, namespace = _split_name(name, echo.tools)
    return FunctionCallItem(
        arguments=arguments,
        call_id=call_id,
        name=local,
        id=item_id(response_id, _CALL, position),
        namespace=namespace,
        status=status,
    )


def response_object(
    *,
    response_id: str,
    model: str,
    created_at: int,
    echo: ResponseEcho,
    output: list[OutputItem],
    status: str,
    usage: ResponseUsage | None,
    kv_transfer_params: dict[str, Any] | None = None,
) -> ResponsesResponse:
    """vLLM's ResponsesResponse.from_request with the request fields taken from ``echo``."""
    return ResponsesResponse(
        id=response_id,
        created_at=created_at,
        incomplete_details={"reason": "max_output_tokens"} if status == "incomplete" else None,
        instructions=echo.instructions,
        metadata=echo.metadata,
        model=model,
        object="response",
        output=output,
        parallel_tool_calls=echo.parallel_tool_calls,
        temperature=echo.temperature,
        tool_choice=echo.tool_choice,
        tools=echo.tools,
        top_p=echo.top_p,
        background=echo.background,
        max_output_tokens=echo.max_output_tokens,
        max_tool_calls=echo.max_tool_calls,
        previous_response_id=echo.previous_response_id,
        prompt=None,
        prompt_cache_options=None,
        prompt_cache_key=echo.prompt_cache_key,
        prompt_cache_retention=echo.prompt_cache_retention,
        reasoning=echo.reasoning,
        safety_identifier=echo.safety_identifier,
        service_tier=echo.service_tier,
        status=status,
        text=echo.text,
        top_logprobs=echo.top_logprobs,
        truncation=echo.truncation,
        usage=usage,
        user=echo.user,
        presence_penalty=echo.presence_penalty,
        frequency_penalty=echo.frequency_penalty,
        kv_transfer_params=kv_transfer_params,
    )


def usage(prompt_tokens: int, output_tokens: int, reasoning_tokens: int) -> ResponseUsage:
    return ResponseUsage(
        input_tokens=prompt_tokens,
        output_tokens=output_tokens,
        total_tokens=prompt_tokens + output_tokens,
        output_tokens_details=OutputTokensDetails(reasoning_tokens=reasoning_tokens),
    )


def batch_output(
    response_id: str, message: dict[str, Any], finish_reason: str | None, echo: ResponseEcho
) -> list[OutputItem]:
    """The output items of one chat message: reasoning, text, then each call, as streamed."""
    last = _status(finish_reason)
    calls = message.get("tool_calls") or []
    parts: list[tuple[int, Any]] = []
    if message.get("reasoning"):
        parts.append((_REASONING, message["reasoning"]))
    if message.get("content"):
        parts.append((_MESSAGE, message["content"]))
    parts.extend((_CALL, call) for call in calls)
    items: list[OutputItem] = []
    for position, (kind, value) in enumerate(parts):
        status = last if position == len(parts) - 1 else "completed"
        if kind == _REASONING:
            items.append(
                ReasoningItem(
                    id=item_id(response_id, kind, position),
                    content=[ReasoningText(text=value)],
                    status=status,
                )
            )
        elif kind == _MESSAGE:
            items.append(
                MessageItem(
                    id=item_id(response_id, kind, position),
                    content=[OutputText(text=value)],
                    status=status,
                )
            )
        else:
            function = value["function"]
            items.append(
                _call_item(
                    position,
                    response_id,
                    value["id"],
                    function["name"],
                    function["arguments"],
                    status,
                    echo,
                )
            )
    return items


class _Emitter:
    """Collects one call's events, numbering them from the state's sequence."""

    def __init__(self, state: ResponsesStream) -> None:
        self.state = state
        self.events: list[StreamEvent] = []

    def emit(self, cls: type[Any], **fields: Any) -> None:
        self.events.append(cls(sequence_number=self.state.sequence, **fields))
        self.state = msgspec.structs.replace(self.state, sequence=self.state.sequence + 1)

    def update(self, **fields: Any) -> None:
        self.state = msgspec.structs.replace(self.state, **fields)

    def snapshot(
        self, status: str, output: list[OutputItem], with_usage: bool
    ) -> ResponsesResponse:
        state = self.state
        return response_object(
            response_id=state.response_id,
            model=state.model,
            created_at=state.created_at,
            echo=state.echo,
            output=output,
            status=status,
            usage=(
                usage(state.prompt_tokens, state.output_tokens, state.reasoning_tokens)
                if with_usage
                else None
            ),
        )

    @property
    def position(self) -> int:
        return len(self.state.done)

    def open(self, kind: int, call: dict[str, Any] | None = None) -> None:
        self.close("completed")
        state = self.state
        ident = item_id(state.response_id, kind, self.position)
        index = self.position
        if kind == _REASONING:
            item: OutputItem = ReasoningItem(id=ident, status="in_progress")
        elif kind == _MESSAGE:
            item = MessageItem(id=ident, content=[], status="in_progress")
        else:
            assert call is not None
            name = call["function"]["name"]
            item = _call_item(
                index, state.response_id, call["id"], name, "", "in_progress", state.echo
            )
            self.update(call_index=call["index"], call_name=name, call_id=call["id"])
        self.emit(OutputItemAdded, output_index=index, item=item)
        if kind == _REASONING:
            self.emit(
                ContentPartAdded,
                output_index=index,
                item_id=ident,
                content_index=0,
                part=ReasoningText(text=""),
            )
        elif kind == _MESSAGE:
            self.emit(
                ContentPartAdded,
                output_index=index,
                item_id=ident,
                content_index=0,
                part=OutputText(text="", logprobs=[]),
            )
        self.update(kind=kind, text="")

    def delta(self, text: str) -> None:
        state = self.state
        index = self.position
        ident = item_id(state.response_id, state.kind, index)
        if state.kind == _REASONING:
            self.emit(
                ReasoningTextDelta, output_index=index, item_id=ident, content_index=0, delta=text
            )
        elif state.kind == _MESSAGE:
            self.emit(
                OutputTextDelta, output_index=index, item_id=ident, content_index=0, delta=text
            )
        else:
            self.emit(ArgumentsDelta, output_index=index, item_id=ident, delta=text)
        self.update(text=state.text + text)

    def close(self, status: str) -> None:
        state = self.state
        if state.kind == _NONE:
            return
        index = self.position
        ident = item_id(state.response_id, state.kind, index)
        text = state.text
        item: OutputItem
        if state.kind == _REASONING:
            part = ReasoningText(text=text)
            self.emit(
                ReasoningTextDone, output_index=index, item_id=ident, content_index=0, text=text
            )
            self.emit(
                ContentPartDone, output_index=index, item_id=ident, content_index=0, part=part
            )
            item = ReasoningItem(id=ident, content=[part], status=status)
        elif state.kind == _MESSAGE:
            out = OutputText(text=text)
            self.emit(OutputTextDone, output_index=index, item_id=ident, content_index=0, text=text)
            self.emit(ContentPartDone, output_index=index, item_id=ident, content_index=0, part=out)
            item = MessageItem(id=ident, content=[out] if text else [], status=status)
        else:
            self.emit(
                ArgumentsDone,
                output_index=index,
                item_id=ident,
                arguments=text,
                name=state.call_name,
            )
            item = _call_item(
                index, state.response_id, state.call_id, state.call_name, text, status, state.echo
            )
        self.emit(OutputItemDone, output_index=index, item=item)
        self.update(kind=_NONE, text="", call_index=-1, done=(*self.state.done, item))


def step(
    state: ResponsesStream,
    delta: dict[str, Any] | None,
    finish_reason: str | None,
    new_tokens: int,
    new_reasoning_tokens: int,
) -> tuple[ResponsesStream, list[StreamEvent]]:
    """One chat stream delta (None for a usage-only chunk) -> the Responses events it makes."""
    out = _Emitter(state)
    if state.finished:
        return state, out.events
    if not state.started:
        snapshot = out.snapshot("in_progress", [], with_usage=False)
        out.emit(ResponseCreated, response=snapshot)
        out.emit(ResponseInProgress, response=snapshot)
        out.update(started=True)
    out.update(
        output_tokens=out.state.output_tokens + new_tokens,
        reasoning_tokens=out.state.reasoning_tokens + new_reasoning_tokens,
    )
    if delta is not None:
        if delta.get("reasoning"):
            if out.state.kind != _REASONING:
                out.open(_REASONING)
            out.delta(delta["reasoning"])
        if delta.get("content"):
            if out.state.kind != _MESSAGE:
                out.open(_MESSAGE)
            out.delta(delta["content"])
        for call in delta.get("tool_calls") or []:
            function = call.get("function") or {}
            if call.get("id") is not None and function.get("name") is not None:
                out.open(_CALL, call)
            arguments = function.get("arguments")
            if arguments and out.state.kind == _CALL and call["index"] == out.state.call_index:
                out.delta(arguments)
    if finish_reason is not None:
        status = _status(finish_reason)
        out.close(status)
        final = out.snapshot(status, list(out.state.done), with_usage=True)
        out.emit(
            ResponseIncomplete if status == "incomplete" else ResponseCompleted, response=final
        )
        out.update(finished=True)
    return out.state, out.events


# ---- the endpoint ---------------------------------------------------------------------------


def _responses_request(raw: dict[str, Any]) -> ResponsesRequest:
    request = convert(raw, ResponsesRequest, "body.responses_request")
    return msgspec.structs.replace(request, tool_choice=api.check_request(request))


def _chat_request(request: ResponsesRequest) -> dict[str, Any]:
    return msgspec.to_builtins(api.parse_chat_request(request))  # type: ignore[no-any-return]


def _echo(d: Derenderer, request: ResponsesRequest, prompt_len: int) -> ResponseEcho:
    """The request fields a Responses response repeats, with vLLM's resolved sampling values."""
    defaults = d.model.info.sampling_defaults
    temperature = request.temperature
    if temperature is None:
        temperature = defaults.get("temperature", 1.0)
    top_p = request.top_p if request.top_p is not None else defaults.get("top_p", 1.0)
    # The output budget render gave (its errors were already answered by render).
    budgets = [d.model.info.max_model_len - prompt_len]
    if request.max_output_tokens is not None:
        budgets.append(request.max_output_tokens)
    elif "max_tokens" in defaults:
        budgets.append(int(defaults["max_tokens"]))
    include = request.include or []
    return ResponseEcho(
        instructions=request.instructions,
        metadata=request.metadata,
        parallel_tool_calls=request.parallel_tool_calls is not False,
        temperature=float(temperature),
        tool_choice=request.tool_choice,
        tools=request.tools,
        top_p=float(top_p),
        background=bool(request.background),
        max_output_tokens=max(1, min(budgets)),
        max_tool_calls=request.max_tool_calls,
        previous_response_id=request.previous_response_id,
        prompt_cache_key=request.prompt_cache_key,
        prompt_cache_retention=request.prompt_cache_retention,
        reasoning=request.reasoning,
        safety_identifier=request.safety_identifier,
        service_tier=request.service_tier,
        text=request.text,
        top_logprobs=request.top_logprobs if "message.output_text.logprobs" in include else None,
        truncation=request.truncation or "disabled",
        user=request.user,
        presence_penalty=float(_or_default(request.presence_penalty, defaults, "presence_penalty")),
        frequency_penalty=float(
            _or_default(request.frequency_penalty, defaults, "frequency_penalty")
        ),
    )


def _or_default(value: float | None, defaults: dict[str, Any], name: str) -> Any:
    return value if value is not None else defaults.get(name, 0.0)


def _reasoning_markers(d: Derenderer) -> tuple[int, int] | None:
    """(start, end) ids of the reasoning block, for vLLM's reasoning token count."""
    if d.machine.parsing is None:
        return None
    parser = d.machine.parsing.parser(ParseRequest())
    family = None if parser is None else parser.reasoning_parser or parser.reasoning
    if family is None:
        return None
    return family.start_id, family.end_id


def count_reasoning(
    ids: Sequence[int], markers: tuple[int, int] | None, depth: int
) -> tuple[int, int]:
    """Tokens between start and end markers (vLLM's depth count): (count, depth after)."""
    if markers is None:
        return 0, depth
    start, end = markers
    count = 0
    for token in ids:
        if token == start:
            depth += 1
        elif token == end:
            depth = max(0, depth - 1)
        elif depth > 0:
            count += 1
    return count, depth


def derender_responses(d: Derenderer, body: DerenderResponsesRequest) -> ResponsesResponse:
    """A generate answer as an OpenAI Responses response (first choice)."""
    if body.responses_request is None:
        raise InvalidRequest(api_streams.MISSING_REQUEST.format(field="responses_request"))
    request = _responses_request(body.responses_request)
    prompt_tokens = api_streams.prompt_tokens(body.prompt_tokens, body.prompt_token_ids)
    chat = api_streams.as_builtins(
        d.derender_chat(
            DerenderChatRequest(
                model=body.model,
                generate_response=body.generate_response,
                prompt_tokens=prompt_tokens,
                prompt_token_ids=body.prompt_token_ids,
                chat_request=_chat_request(request),
            )
        )
    )
    choice = chat["choices"][0]
    echo = _echo(d, request, len(body.prompt_token_ids or []) or prompt_tokens)
    response_id = chat["id"]
    output = batch_output(response_id, choice["message"], choice["finish_reason"], echo)
    ids = body.generate_response.choices[0].token_ids or []
    reasoning, _ = count_reasoning(ids, _reasoning_markers(d), 0)
    status = "incomplete" if choice["finish_reason"] == "length" else "completed"
    return response_object(
        response_id=response_id,
        model=chat["model"],
        created_at=chat["created"],
        echo=echo,
        output=output,
        status=status,
        usage=usage(prompt_tokens, len(ids), reasoning),
        kv_transfer_params=chat["kv_transfer_params"],
    )


def derender_responses_stream(
    d: Derenderer, body: DerenderResponsesStreamRequest
) -> ResponsesDerenderEvents:
    """Generate chunks -> ``{"events": [...], "stream_state": ...}`` of Responses stream events."""
    chunks = stream_chunks(body.generate_chunk, body.generate_chunks)
    chat_token, stream = api_streams.split_state(
        d.streams.codecs["responses"], body.stream_state, ResponsesStream
    )
    request = None
    if stream is None:
        if body.responses_request is None:
            raise InvalidRequest(api_streams.MISSING_REQUEST.format(field="responses_request"))
        request = _responses_request(body.responses_request)
    chat_request = _chat_request(request) if request is not None else None
    outs, chat_state = api_streams.chat_stream(
        d, body, chunks, chat_token, chat_request, "responses"
    )
    if stream is None:
        assert request is not None
        prompt_tokens = api_streams.prompt_tokens(body.prompt_tokens, body.prompt_token_ids)
        stream = ResponsesStream(
            response_id=chunks[0].request_id,
            model=body.model or d.model_name,
            created_at=int(time.time()),
            prompt_tokens=prompt_tokens,
            echo=_echo(d, request, len(body.prompt_token_ids or []) or prompt_tokens),
        )
    markers = _reasoning_markers(d)
    events: list[StreamEvent] = []
    for chunk, out in zip(chunks, outs, strict=True):
        delta, finish, _ = api_streams.chat_delta(out)
        ids = api_streams.chunk_ids(chunk)
        reasoning, depth = count_reasoning(ids, markers, stream.reasoning_depth)
        stream, more = step(stream, delta, finish, len(ids), reasoning)
        stream = msgspec.structs.replace(stream, reasoning_depth=depth)
        events.extend(more)
    token = api_streams.join_state(d.streams.codecs["responses"], chat_state, stream)
    return ResponsesDerenderEvents(events=events, stream_state=token)
