"""OpenAI Responses requests -> GenerateRequest, as vLLM 0.33's stateless render endpoint builds it.

The prompt is the chat template over the messages and function tools ``apis.responses`` builds;
the answer is thinner than chat's (no parse context, reasoning state or stream options) and its
sampling params are ``ResponsesRequest.to_sampling_params``'s.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import msgspec

from render_service.apis import responses as api
from render_service.errors import InvalidRequest, invalid_param
from render_service.protocol.chat import ChatCompletionRequest
from render_service.protocol.generate import GenerateRequest, ParseContext, ReasoningParserKwargs
from render_service.protocol.responses import ResponsesRequest
from render_service.render.chat import harmony_structured, render_messages
from render_service.render.harmony import REASONING_EFFORTS
from render_service.render.request_checks import base_request_id
from render_service.render.sampling import (
    build_sampling_params,
    sampled_values,
    structured_outputs,
)
from render_service.validation import stop_strings

if TYPE_CHECKING:
    from render_service.render.renderer import Renderer


def render_responses(renderer: Renderer, request: ResponsesRequest) -> GenerateRequest:
    """A Responses request rendered as vLLM's stateless render endpoint does (no history lookup)."""
    request = msgspec.structs.replace(request, tool_choice=api.check_request(request))
    renderer.model.check_name(request.model)
    api.refuse_previous_response(request)
    settings = renderer.settings
    tools = api.template_tools(request, settings.exclude_tools_when_tool_choice_none)
    kwargs = api.template_kwargs(request, settings)
    effort = request.reasoning.effort if request.reasoning is not None else None
    harmony = renderer.model.harmony is not None
    if harmony:
        _check_harmony_effort(kwargs.get("reasoning_effort"))
    chat = ChatCompletionRequest(
        messages=api.input_messages(request),
        chat_template_kwargs=request.chat_template_kwargs,
        add_special_tokens=True,  # vLLM's TokenizeParams default: Llama gets a second BOS
        truncate_prompt_tokens=-1 if request.truncation != "disabled" else None,
        media_io_kwargs=request.media_io_kwargs,
        mm_processor_kwargs=request.mm_processor_kwargs,
        mm_payload=request.mm_payload,
        reasoning_effort=effort,  # Harmony writes it into the system message (mapped there)
    )
    prompt = render_messages(renderer, chat, tools, kwargs)
    ids = prompt.token_ids
    if not ids:
        raise InvalidRequest("No token_ids rendered")
    max_tokens = renderer.prompts.max_tokens(
        request.max_output_tokens, len(ids), "max_output_tokens"
    )
    structured = structured_outputs(api.check_text_format(request), None)
    parsing = renderer.parsing
    context = _parse_context(request, kwargs)
    hints = parsing.render_hints(context, ids) if parsing else None
    if harmony and parsing is not None:
        structured = harmony_structured(parsing, context, structured)
    elif hints is not None and hints.structural_tag is not None:
        structured = {"structural_tag": hints.structural_tag}
    skip_special = request.skip_special_tokens
    if skip_special is None:
        skip_special = renderer.model.info.sampling_defaults.get("skip_special_tokens", True)
    if hints is not None and hints.skip_special_tokens is not None:
        skip_special = hints.skip_special_tokens
    sampling = _sampling_params(renderer, request, max_tokens, bool(skip_special), structured)
    return GenerateRequest(
        request_id=request.request_id or f"resp_{base_request_id(None, None)}",
        token_ids=ids,
        features=prompt.features,
        sampling_params=sampling,
        model=request.model,
        reasoning_parser_kwargs=(
            ReasoningParserKwargs(chat_template_kwargs=kwargs)
            if parsing is not None and parsing.has_reasoning
            else None
        ),
        stream=bool(request.stream),
        cache_salt=request.cache_salt,
        priority=request.priority,
        kv_transfer_params=request.kv_transfer_params,
        ec_transfer_params=request.ec_transfer_params,
    )


def _check_harmony_effort(effort: str | None) -> None:
    """vLLM's Responses Harmony preamble takes only Harmony's efforts ("none" included)."""
    if effort is not None and effort not in REASONING_EFFORTS:
        raise invalid_param(
            f"reasoning_effort={effort!r} is not supported by Harmony. Supported values are: "
            f"{', '.join(REASONING_EFFORTS)}.",
            "reasoning_effort",
        )


def _parse_context(request: ResponsesRequest, kwargs: dict[str, Any]) -> ParseContext:
    """The chat parse context with the Responses tools, for the parser's render hints."""
    return ParseContext(
        tools=api.template_tools(request, False),
        tool_choice=api.chat_tool_choice(request),
        parallel_tool_calls=request.parallel_tool_calls,
        include_reasoning=request.include_reasoning,
        chat_template_kwargs=kwargs,
    )


def _sampling_params(
    renderer: Renderer,
    request: ResponsesRequest,
    max_tokens: int,
    skip_special_tokens: bool,
    structured: dict[str, Any] | None,
) -> dict[str, Any]:
    """ResponsesRequest.to_sampling_params as vLLM serializes it (``extra_args`` always there)."""
    defaults = renderer.model.info.sampling_defaults
    sampling = sampled_values(request, defaults)
    include = request.include or []
    out = build_sampling_params(
        n=1,
        sampling=sampling,
        seed=request.seed,
        stop=stop_strings(request.stop),
        stop_token_ids=list(request.stop_token_ids or []),
        ignore_eos=request.ignore_eos,
        max_tokens=max_tokens,
        min_tokens=0,
        logprobs=request.top_logprobs if "message.output_text.logprobs" in include else None,
        prompt_logprobs=None,
        logprob_token_ids=None,
        skip_special_tokens=skip_special_tokens,
        spaces_between_special_tokens=request.spaces_between_special_tokens,
        include_stop_str_in_output=request.include_stop_str_in_output,
        stream=bool(request.stream),
        stream_interval=None,
        structured=structured_outputs(structured, None),
        logit_bias=request.logit_bias,
        allowed_token_ids=None,
        extra_args=None,
        bad_words=[],
        thinking_token_budget=None,
        repetition_detection=None,
    )
    extra = dict(request.vllm_xargs or {})
    # vLLM hoists transfer params out of extra_args and drops it when that leaves it empty.
    hoisted = not extra and bool(request.kv_transfer_params or request.ec_transfer_params)
    ordered: dict[str, Any] = {}
    for key, value in out.items():
        if key == "bad_words" and not hoisted:
            ordered["extra_args"] = extra  # vLLM sends it even when empty, before bad_words
        ordered[key] = value
    return ordered
