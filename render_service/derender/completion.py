"""Completions derender: generate output -> a Completion (batch) or one chunk per generate chunk
(streaming), through the per-choice machine (no parsers: completions text is plain)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import msgspec

from render_service.derender import logprobs as lp
from render_service.derender.assembly import chunk_usage, now
from render_service.derender.machine import OutputOptions
from render_service.derender.stop_strings import StopStrings, refuse_in_stream
from render_service.errors import InvalidRequest, SchemaError
from render_service.protocol.completions import (
    CompletionRequest,
    CompletionResponse,
    CompletionResponseChoice,
    CompletionResponseStreamChoice,
    CompletionStreamResponse,
)
from render_service.protocol.derender import (
    CompletionDerenderChunk,
    DerenderCompletionRequest,
    DerenderCompletionStreamRequest,
)
from render_service.protocol.usage import UsageInfo
from render_service.validation import convert

if TYPE_CHECKING:
    from render_service.derender.derenderer import Derenderer


def derender_completion(d: Derenderer, body: DerenderCompletionRequest) -> CompletionResponse:
    """Non-streaming completions derender: vLLM's CompletionResponse, one choice per output."""
    d.model.check_name(body.model)
    responses = body.generate_responses
    d.machine.check_responses(responses)
    if not responses:
        raise InvalidRequest("generate_responses must not be empty")
    for name, values in (
        ("prompt_tokens", body.prompt_tokens),
        ("prompt_token_ids", body.prompt_token_ids),
    ):
        if values is not None and len(values) != len(responses):
            message = f"{name} length ({len(values)}) must equal generate_responses length ({len(responses)})"
            raise SchemaError(
                f"1 validation error:\n  {{'loc': 'body', 'msg': 'Value error, {message}'}}",
                "body",
            )
    request = _completion_request(body.completion_request)
    options = _options(request)
    stops = StopStrings.of(request)
    choices = []
    completion_tokens = 0
    index = 0
    for position, response in enumerate(responses):
        prompt_ids = (body.prompt_token_ids[position] if body.prompt_token_ids else None) or (
            response.prompt_token_ids or []
        )
        for choice in response.choices:
            if not choice.token_ids:
                raise InvalidRequest(f"choice {choice.index} has empty or null token_ids")
            completion_tokens += len(choice.token_ids)
            state = d.machine.start(
                response.request_id, choice.index, prompt_ids, options, None, stream=False
            )
            result = d.machine.step(state, choice, None, finished=True, stops=stops)
            choices.append(
                CompletionResponseChoice(
                    index=index,
                    text=result.text,
                    logprobs=d.machine.completion_logprobs(choice, options, (), 0)[0],
                    finish_reason="stop" if result.stopped else (choice.finish_reason or "stop"),
                    stop_reason=result.stop_reason,
                    prompt_logprobs=response.prompt_logprobs,
                    prompt_token_ids=prompt_ids if options.return_token_ids else None,
                    token_ids=choice.token_ids if options.return_token_ids else None,
                )
            )
            index += 1
    kv = responses[0].kv_transfer_params
    if any(r.kv_transfer_params != kv for r in responses[1:]):
        kv = None
    return CompletionResponse(
        id=responses[0].request_id,
        created=now(),
        model=body.model or d.model_name,
        choices=choices,
        usage=UsageInfo.of(sum(body.prompt_tokens or []), completion_tokens),
        kv_transfer_params=kv,
        metrics=responses[0].metrics if len(responses) == 1 else None,
    )


def derender_completion_stream(
    d: Derenderer, body: DerenderCompletionStreamRequest
) -> CompletionDerenderChunk:
    """One generate chunk of one choice: the completions chunk and the state for the next call."""
    d.model.check_name(body.model)
    chunk = body.generate_chunk
    request = _completion_request(body.completion_request)
    if request is not None:
        refuse_in_stream(request.stop)
    if len(chunk.choices) > 1:
        raise InvalidRequest(
            f"derender_completion_stream expects at most one choice per chunk (got {len(chunk.choices)})."
        )
    choices_out = []
    token = body.stream_state
    if chunk.choices:
        choice = chunk.choices[0]
        prompt_ids = (
            body.prompt_token_ids
            if body.prompt_token_ids is not None
            else (chunk.prompt_token_ids or [])
        )
        d.machine.check_choice(choice)
        state = d.streams.load(
            token,
            chunk,
            lambda: d.machine.start(
                chunk.request_id,
                choice.index,
                prompt_ids,
                _options(request),
                None,
                kind="completions",
            ),
            "completions",
        )
        d.machine.check_chunk_length(state, choice)
        finished = choice.finish_reason is not None
        result = d.machine.step(state, choice, None, finished=finished)
        options = state.options
        logprobs, context = d.machine.completion_logprobs(
            choice, options, state.logprob_context, state.text_offset
        )
        offset = lp.advance_text_offset(state.text_offset, logprobs, result.text)
        choices_out.append(
            CompletionResponseStreamChoice(
                index=choice.index,
                text=result.text,
                logprobs=logprobs,
                finish_reason=choice.finish_reason,
                stop_reason=result.stop_reason,
                prompt_token_ids=chunk.prompt_token_ids if options.return_token_ids else None,
                token_ids=choice.token_ids if options.return_token_ids else None,
                weight_versions=choice.weight_versions,
            )
        )
        new_state = msgspec.structs.replace(
            result.state, role_sent=True, logprob_context=context, text_offset=offset
        )
        token = d.streams.store(new_state, finished, "completions")
    out = CompletionStreamResponse(
        id=chunk.request_id,
        created=now(),
        model=body.model or d.model_name,
        choices=choices_out,
        usage=chunk_usage(body.prompt_tokens, chunk),
        metrics=chunk.metrics,
    )
    return CompletionDerenderChunk(chunk=out, stream_state=token)


def _completion_request(raw: dict[str, object] | None) -> CompletionRequest | None:
    if raw is None:
        return None
    return convert(raw, CompletionRequest, "body.completion_request")


def _options(request: CompletionRequest | None) -> OutputOptions:
    if request is None:
        return OutputOptions()
    return OutputOptions(
        skip_special_tokens=request.skip_special_tokens
        if request.skip_special_tokens is not None
        else True,
        include_stop_str_in_output=request.include_stop_str_in_output,
        stop_token_ids=tuple(request.stop_token_ids or ()),
        logprob_limit=lp.completion_top_limit(request.logprobs, request.logprob_token_ids),
        return_token_ids=bool(request.return_token_ids),
    )
