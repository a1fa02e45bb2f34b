"""Chat derender: generate output -> a ChatCompletion (batch) or one chunk per generate chunk
(streaming), through the per-choice machine."""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial
from typing import TYPE_CHECKING, Any

import msgspec

from parsers import ChatParser, ParseRequest, tool_call_id
from render_service.derender import logprobs as lp
from render_service.derender.assembly import chunk_usage, delta_parts, message_parts, now
from render_service.derender.inputs import NO_INPUTS, Check, StreamInputs, no_check
from render_service.derender.machine import ChoiceState, OutputOptions
from render_service.derender.stop_strings import StopStrings, refuse_in_stream
from render_service.derender.streams import CheckIn, check_same_stream
from render_service.errors import (
    InvalidRequest,
    RenderServiceError,
    RequestAbandoned,
    SchemaError,
)
from render_service.model.parser_setup import resolve_tool_choice
from render_service.model.templating import template_kwargs
from render_service.protocol.chat import (
    ChatCompletionRequest,
    ChatCompletionResponse,
    ChatCompletionResponseChoice,
    ChatCompletionResponseStreamChoice,
    ChatCompletionStreamResponse,
    ChatMessage,
    DeltaMessage,
    ToolCall,
)
from render_service.protocol.derender import (
    ChatDerenderChunk,
    ChatDerenderChunks,
    ChatDerenderStreams,
    DerenderChatRequest,
    DerenderChatStreamRequest,
    DerenderChatStreamsRequest,
    DerenderChatStreamWire,
    DerenderStreamItem,
    GenerateChoice,
    GenerateChunk,
    StreamResult,
)
from render_service.protocol.server import ErrorInfo
from render_service.protocol.usage import UsageInfo
from render_service.validation import convert, stop_strings

if TYPE_CHECKING:
    from render_service.derender.derenderer import Derenderer

MISSING_CHAT_REQUEST = (
    "chat_request is required when a tool or reasoning parser is configured because plain "
    "detokenization would leak raw parser markup into content."
)
MISSING_PROMPT_IDS = (
    "prompt_token_ids is required when a tool or reasoning parser is configured. Without it "
    "parse_delta cannot tell whether the prompt left reasoning open (e.g. a chat template that "
    "pre-opens <think>) and would misclassify reasoning content as plain content."
)


def derender_chat(d: Derenderer, body: DerenderChatRequest) -> ChatCompletionResponse:
    """Non-streaming chat derender: vLLM's ChatCompletionResponse."""
    d.model.check_name(body.model)
    response = body.generate_response
    d.machine.check_responses([response], body.prompt_token_ids)
    request = _chat_request(body.chat_request)
    if d.machine.has_parser and request is None:
        raise InvalidRequest(MISSING_CHAT_REQUEST)
    options = _options(d, request)
    parse_request = _parse_request(d, request) if request is not None else None
    prompt_ids = body.prompt_token_ids or response.prompt_token_ids or []
    # vLLM gives the parser only the generate response's prompt ids (a known asymmetry).
    parser_prompt = response.prompt_token_ids or []
    stops = StopStrings.of(request)
    choices = []
    completion_tokens = 0
    for choice in response.choices:
        if not choice.token_ids:
            raise InvalidRequest(f"choice {choice.index} has empty or null token_ids")
        completion_tokens += len(choice.token_ids)
        state = d.machine.start(
            response.request_id,
            choice.index,
            prompt_ids,
            options,
            parse_request,
            parser_prompt=parser_prompt,
            stream=False,
        )
        parser = d.machine.parser(parse_request)
        choices.append(_message_choice(d, state, choice, parser, stops, parser_prompt))
    return ChatCompletionResponse(
        id=response.request_id,
        created=now(),
        model=body.model or d.model_name,
        choices=choices,
        usage=UsageInfo.of(body.prompt_tokens or 0, completion_tokens),
        prompt_logprobs=response.prompt_logprobs,
        prompt_token_ids=(
            response.prompt_token_ids if request is not None and request.return_token_ids else None
        ),
        kv_transfer_params=response.kv_transfer_params,
        metrics=response.metrics,
    )


def _message_choice(
    d: Derenderer,
    state: ChoiceState,
    choice: GenerateChoice,
    parser: ChatParser | None,
    stops: StopStrings,
    parser_prompt: Sequence[int],
) -> ChatCompletionResponseChoice:
    options = state.options
    result = d.machine.step(state, choice, parser, finished=True, stops=stops)
    finish_reason = "stop" if result.stopped else (choice.finish_reason or "stop")
    reasoning: str | None = None
    content: str | None = result.text
    calls: list[ToolCall] = []
    if parser is not None and result.parser_end is not None:
        answer = parser.batch_answer(
            result.events,
            result.parser_end,
            lambda: parser.without_tools().parse_whole(parser_prompt, result.kept_ids, result.text),
        )
        reasoning, content, calls = message_parts(
            answer, state.request_id, choice.index, options, parser.tool_call_id
        )
        if calls and finish_reason == "stop" and not options.named_tool:
            finish_reason = "tool_calls"
    hide = parser is not None and not options.include_reasoning
    return ChatCompletionResponseChoice(
        index=choice.index,
        message=ChatMessage(
            content=content, tool_calls=calls or msgspec.UNSET, reasoning=reasoning
        ),
        logprobs=None if hide else d.machine.chat_logprobs(choice, options, ())[0],
        finish_reason=finish_reason,
        stop_reason=result.stop_reason,
        token_ids=choice.token_ids if options.return_token_ids and not hide else None,
    )


def derender_chat_stream(
    d: Derenderer,
    body: DerenderChatStreamRequest | DerenderChatStreamWire,
    check: Check | None = None,
    kind: str = "chat",
) -> ChatDerenderChunk | ChatDerenderChunks:
    """Streaming chunks of one choice: the chunk and the state for the next call.

    With ``generate_chunks`` (several generate chunks of one choice, in order) the answer holds
    one derendered chunk each and one state at the end. ``check``: the server's checks of an
    embedded chat request (its limits), run when the request is decoded. ``kind``: the endpoint
    whose stream this is (``streams.STREAM_KINDS``).
    """
    chunks = stream_chunks(body.generate_chunk, body.generate_chunks)
    call = StreamCall(
        model=body.model,
        chunks=chunks,
        stream_state=body.stream_state,
        prompt_tokens=body.prompt_tokens,
        inputs=stream_inputs(body, check),
        seed=body.derender_seed,
        kind=kind,
    )
    outs, token = stream_call(d, call)
    if body.generate_chunks is not None:
        return ChatDerenderChunks(chunks=outs, stream_state=token)
    return ChatDerenderChunk(chunk=outs[0], stream_state=token)


def stream_inputs(
    body: DerenderChatStreamRequest | DerenderChatStreamWire | DerenderStreamItem,
    check: Check | None = None,
    msgpack: bool = False,
) -> StreamInputs:
    """The call's prompt ids and chat request: raw JSON (or msgpack) from the HTTP layer, else
    values."""
    if isinstance(body, DerenderChatStreamRequest):
        return StreamInputs(body.prompt_token_ids, body.chat_request)
    if body.prompt_token_ids is msgspec.UNSET and body.chat_request is msgspec.UNSET:
        return NO_INPUTS  # a lean call, most chunks of a stream
    return StreamInputs.of_raw(
        body.prompt_token_ids, body.chat_request, check or no_check, msgpack=msgpack
    )


class StreamCall(msgspec.Struct, frozen=True):
    """One streaming call of one choice, whichever endpoint carried it (a Struct: one is made
    per item of a multi-stream call, and a frozen dataclass took longer to build)."""

    model: str | None
    chunks: Sequence[GenerateChunk]
    stream_state: Any
    prompt_tokens: int | None
    inputs: StreamInputs
    seed: str | None = None
    #: The endpoint whose stream this is: its states are signed for it alone.
    kind: str = "chat"
    #: The answers' ``created`` (a multi-stream call reads the clock once for all its items).
    created: int | None = None


def stream_call(
    d: Derenderer, call: StreamCall, check_ins: list[CheckIn] | None = None
) -> tuple[list[ChatCompletionStreamResponse], Any]:
    """The derendered chunks of one call and the ``stream_state`` for the next.

    ``check_ins``: where the state's parser-cache entry goes, for the caller to check in with
    those of other calls (else it is checked in now)."""
    d.model.check_name(call.model)
    for chunk in call.chunks:  # every bound before any work
        if len(chunk.choices) > 1:
            raise InvalidRequest(
                "derender_chat_stream expects at most one choice per chunk "
                f"(got {len(chunk.choices)})."
            )
        for generated in chunk.choices:
            d.machine.check_choice(generated)
    token = call.stream_state
    state: ChoiceState | None = None
    outs = []
    finished = False
    for chunk in call.chunks:
        if not chunk.choices:
            request = call.inputs.chat_request()
            return_ids = request is not None and bool(request.return_token_ids)
            outs.append(_stream_response(d, *_answer_of(call), chunk, [], return_ids))
            continue
        if state is None:
            state = _load(d, call, chunk)
        else:
            check_same_stream(state, chunk)
        parser = d.machine.parser(state.parse_request, state.parser_key)
        choice, state = _stream_choice(d, chunk, state, parser)
        finished = chunk.choices[0].finish_reason is not None
        # The request's return_token_ids is the state's: one request was checked against it.
        return_ids = call.inputs.has_chat_request and state.options.return_token_ids
        outs.append(_stream_response(d, *_answer_of(call), chunk, [choice], return_ids))
    if state is not None:
        token = d.streams.store(state, finished, call.kind, check_ins)
    return outs, token


def _load(d: Derenderer, call: StreamCall, chunk: GenerateChunk) -> ChoiceState:
    """The state ``chunk`` continues, its inputs decoded and checked only where they must be:
    on a stream's first call, and where they differ from the ones the stream started with."""
    inputs = call.inputs
    token = call.stream_state
    if token is None and call.seed is not None:
        if inputs.has_chat_request or inputs.prompt_ids() is not None:
            _check_inputs(inputs)
        return d.seeds.start(call.seed, chunk, call.kind)
    if token is None or isinstance(token, dict):
        request = _check_inputs(inputs)
        fresh = partial(_fresh_state, d, chunk, request, inputs.prompt_ids(), call.kind)
        state = d.streams.load(token, chunk, fresh, call.kind)
        return msgspec.structs.replace(state, inputs=inputs.digest) if inputs.digest else state
    try:
        state = d.streams.load(token, chunk, _no_fresh_state, call.kind)
    except RenderServiceError:
        inputs.validate()  # a body with bad inputs too answers as a whole decode would
        raise
    if inputs is not NO_INPUTS and (not inputs.digest or inputs.digest != state.inputs):
        _check_inputs(inputs)
    return state


def _check_inputs(inputs: StreamInputs) -> ChatCompletionRequest | None:
    """Validate a call's inputs as vLLM does on every call; the chat request, if any."""
    inputs.prompt_ids()
    request = inputs.chat_request()
    if request is not None:
        refuse_in_stream(request.stop)
    return request


def _no_fresh_state() -> ChoiceState:
    raise AssertionError("a signed stream_state never starts a stream")


def _fresh_state(
    d: Derenderer,
    chunk: GenerateChunk,
    request: ChatCompletionRequest | None,
    prompt_ids: list[int] | None,
    kind: str,
) -> ChoiceState:
    if d.machine.has_parser and request is None:
        raise InvalidRequest(MISSING_CHAT_REQUEST)
    if d.machine.has_parser and prompt_ids is None:
        raise InvalidRequest(MISSING_PROMPT_IDS)
    ids = prompt_ids if prompt_ids is not None else (chunk.prompt_token_ids or [])
    parse_request = _parse_request(d, request) if request is not None else None
    return d.machine.start(
        chunk.request_id,
        chunk.choices[0].index,
        ids,
        _options(d, request),
        parse_request,
        kind=kind,
    )


def derender_chat_streams(
    d: Derenderer,
    body: DerenderChatStreamsRequest | Sequence[DerenderChatStreamRequest],
    check: Check | None = None,
    msgpack: bool = False,
) -> ChatDerenderStreams:
    """One chunk for each of many streams, in order; an item that fails gets the error a
    single-stream call would have answered, and the others go on. ``msgpack``: the body was
    msgpack (its raw fields are)."""
    model = body.model if isinstance(body, DerenderChatStreamsRequest) else None
    items: Sequence[DerenderStreamItem | DerenderChatStreamRequest] = (
        body.items if isinstance(body, DerenderChatStreamsRequest) else body
    )
    d.model.check_name(model)
    created = now()
    check_ins: list[CheckIn] = []
    parsers: dict[bytes, ChatParser | None] = {}
    results = []
    for item in items:
        if (
            isinstance(item, DerenderStreamItem)
            and item.prompt_token_ids is msgspec.UNSET
            and item.chat_request is msgspec.UNSET
            and item.derender_seed is None
            and isinstance(item.stream_state, str)
            and len(item.generate_chunk.choices) == 1
        ):
            try:  # a running stream's lean item, most items of most calls
                out, token = _lean_item(d, item, model, created, check_ins, parsers)
            except RequestAbandoned:
                raise
            except RenderServiceError as exc:
                results.append(StreamResult(error=_error_info(exc)))
            else:
                results.append(StreamResult(chunk=out, stream_state=token))
            continue
        if isinstance(item, DerenderChatStreamRequest):
            item_model = item.model or model
            chunks = stream_chunks(item.generate_chunk, item.generate_chunks)
        else:
            item_model, chunks = model, [item.generate_chunk]
        call = StreamCall(
            model=item_model,
            chunks=chunks,
            stream_state=item.stream_state,
            prompt_tokens=item.prompt_tokens,
            inputs=stream_inputs(item, check, msgpack),
            seed=item.derender_seed,
            created=created,
        )
        try:
            outs, token = stream_call(d, call, check_ins)
        except RequestAbandoned:
            raise  # no one reads the other items' answers either
        except RenderServiceError as exc:
            results.append(StreamResult(error=_error_info(exc)))
            continue
        for out in outs[:-1]:  # several generate chunks of one library item: all but the last
            results.append(StreamResult(chunk=out, stream_state=item.stream_state))
        results.append(StreamResult(chunk=outs[-1], stream_state=token))
    d.streams.check_in(check_ins)
    return ChatDerenderStreams(items=results)


def _lean_item(
    d: Derenderer,
    item: DerenderStreamItem,
    model: str | None,
    created: int,
    check_ins: list[CheckIn],
    parsers: dict[bytes, ChatParser | None],
) -> tuple[ChatCompletionStreamResponse, str]:
    """``stream_call`` of an item that continues a signed state with one choice and no inputs,
    without what such an item never needs (its inputs, a fresh state, a chunk loop).

    ``parsers``: the call's parsers by parser key (streams of one request shape share one)."""
    chunk = item.generate_chunk
    generated = chunk.choices[0]
    d.machine.check_choice(generated)
    state = d.streams.load(item.stream_state, chunk, _no_fresh_state)
    key = state.parser_key
    if key is None:
        parser = d.machine.parser(state.parse_request)
    elif key.digest in parsers:
        parser = parsers[key.digest]
    else:
        parser = parsers[key.digest] = d.machine.parser(state.parse_request, key)
    choice, state = _stream_choice(d, chunk, state, parser)
    finished = generated.finish_reason is not None
    out = _stream_response(d, model, item.prompt_tokens, created, chunk, [choice], False)
    return out, d.streams.store(state, finished, "chat", check_ins)


def _error_info(exc: RenderServiceError) -> ErrorInfo:
    return ErrorInfo(message=exc.message, type=exc.error_type, param=exc.param, code=exc.status)


def derender_seed(
    d: Derenderer, request: ChatCompletionRequest | dict[str, Any], prompt_ids: list[int]
) -> str:
    """The seed a stream of ``request``, rendered to ``prompt_ids``, starts from: the state a
    first call with both would build (``_fresh_state``), not yet bound to a generate request."""
    if isinstance(request, dict):
        request = convert(request, ChatCompletionRequest, "body")
    parse_request = _parse_request(d, request)
    start = d.machine.begin(prompt_ids, _options(d, request), parse_request)
    return d.seeds.make(start, stops=bool(stop_strings(request.stop)))


def _stream_choice(
    d: Derenderer,
    chunk: GenerateChunk,
    state: ChoiceState,
    parser: ChatParser | None,
) -> tuple[ChatCompletionResponseStreamChoice, ChoiceState]:
    """One generate chunk of one choice -> the OpenAI stream choice and the next state
    (``parser``: the state's parser)."""
    choice = chunk.choices[0]
    d.machine.check_chunk_length(state, choice)
    finished = choice.finish_reason is not None
    result = d.machine.step(state, choice, parser, finished=finished)
    options = state.options
    reasoning, content, calls = delta_parts(
        result.events,
        chunk.request_id,
        choice.index,
        options,
        parser.tool_call_id if parser is not None else tool_call_id,
    )
    if parser is None:
        content = result.text or None
    finish_reason = choice.finish_reason
    parser_state = result.state.parser
    if (
        finished
        and parser_state is not None
        and parser_state.tools_emitted
        and finish_reason == "stop"
        and not options.named_tool
    ):
        finish_reason = "tool_calls"
    hide = parser is not None and not options.include_reasoning
    logprobs, context = d.machine.chat_logprobs(choice, options, state.logprob_context)
    out = ChatCompletionResponseStreamChoice(
        index=choice.index,
        delta=DeltaMessage(
            role=None if state.role_sent else "assistant",
            content=content,
            reasoning=reasoning,
            tool_calls=calls or msgspec.UNSET,
        ),
        logprobs=None if hide else logprobs,
        finish_reason=finish_reason,
        stop_reason=result.stop_reason,
        token_ids=choice.token_ids if options.return_token_ids and not hide else None,
        weight_versions=choice.weight_versions,
    )
    return out, msgspec.structs.replace(result.state, role_sent=True, logprob_context=context)


def _answer_of(call: StreamCall) -> tuple[str | None, int | None, int]:
    """What a call's answers take from it: model, prompt_tokens and created."""
    return call.model, call.prompt_tokens, now() if call.created is None else call.created


def _stream_response(
    d: Derenderer,
    model: str | None,
    prompt_tokens: int | None,
    created: int,
    chunk: GenerateChunk,
    choices: list[ChatCompletionResponseStreamChoice],
    return_ids: bool,
) -> ChatCompletionStreamResponse:
    return ChatCompletionStreamResponse(
        id=chunk.request_id,
        created=created,
        model=model or d.model_name,
        choices=choices,
        usage=chunk_usage(prompt_tokens, chunk),
        prompt_token_ids=chunk.prompt_token_ids if return_ids else None,
        metrics=chunk.metrics,
    )


def _chat_request(raw: dict[str, Any] | None) -> ChatCompletionRequest | None:
    if raw is None:
        return None
    return convert(raw, ChatCompletionRequest, "body.chat_request")


def _options(d: Derenderer, request: ChatCompletionRequest | None) -> OutputOptions:
    has_parser = d.machine.has_parser
    if request is None:
        return OutputOptions(skip_special_tokens=not has_parser)
    choice = resolve_tool_choice(request)
    skip = request.skip_special_tokens if request.skip_special_tokens is not None else True
    return OutputOptions(
        skip_special_tokens=False if has_parser else skip,
        include_stop_str_in_output=request.include_stop_str_in_output,
        stop_token_ids=tuple(request.stop_token_ids or ()),
        logprob_limit=lp.chat_top_limit(
            request.logprobs, request.top_logprobs, request.logprob_token_ids
        ),
        return_token_ids=bool(request.return_token_ids),
        include_reasoning=request.include_reasoning,
        parallel_tool_calls=request.parallel_tool_calls is not False,
        forced_tools=choice == "required" or isinstance(choice, dict),
        named_tool=isinstance(choice, dict),
    )


def _parse_request(d: Derenderer, request: ChatCompletionRequest) -> ParseRequest | None:
    parsing = d.machine.parsing
    if parsing is None:
        return None
    tools = [msgspec.to_builtins(t) for t in request.tools] if request.tools else None
    return parsing.parse_request(
        {
            "tools": tools,
            "tool_choice": resolve_tool_choice(request),
            "parallel_tool_calls": request.parallel_tool_calls,
            "include_reasoning": request.include_reasoning,
            "chat_template_kwargs": template_kwargs(request, d.settings),
            "history_tool_call_cnt": 0,
        }
    )


def stream_chunks(
    one: GenerateChunk | None, several: list[GenerateChunk] | None
) -> Sequence[GenerateChunk]:
    if (one is None) == (several is None) or several == []:
        raise SchemaError(
            "1 validation error:\n  {'loc': 'body.generate_chunk', 'msg': 'Give exactly one of "
            "generate_chunk and a non-empty generate_chunks'}",
            "body.generate_chunk",
        )
    return [one] if one is not None else list(several or [])
