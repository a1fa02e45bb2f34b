"""Completion requests -> one GenerateRequest per prompt (text or token ids)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from render_service.errors import InvalidRequest, SchemaError, invalid_param
from render_service.protocol.completions import CompletionRequest
from render_service.protocol.generate import GenerateRequest
from render_service.render.prompt import Prompt
from render_service.render.request_checks import base_request_id, check_cache_salt
from render_service.render.sampling import (
    request_sampling_params,
    stream_options,
    structured_outputs,
)
from render_service.validation import convert, stop_strings

if TYPE_CHECKING:
    from render_service.render.renderer import Renderer


def render_completion(
    renderer: Renderer,
    request: CompletionRequest | dict[str, Any],
    *,
    request_id: str | None = None,
) -> list[GenerateRequest]:
    """Render a completion request: one GenerateRequest per prompt."""
    if isinstance(request, dict):
        request = convert(request, CompletionRequest, "body")
    renderer.model.check_name(request.model)
    if request.use_beam_search:
        raise InvalidRequest("Beam search is not supported by the render endpoint")
    if request.stream_options is not None and not request.stream:
        raise invalid_param(
            "Stream options can only be defined when `stream=True`.", "stream_options"
        )
    if request.suffix is not None:
        if request.echo:
            raise InvalidRequest("Echo is unsupported with suffix.", "suffix")
        raise InvalidRequest(
            "suffix is only supported for models with FIM completion rendering", "suffix"
        )
    stop_strings(request.stop)
    check_cache_salt(request.cache_salt)
    prompts = _prompts(renderer, request)
    base_id = base_request_id(request_id, request.request_id)
    structured = structured_outputs(request.structured_outputs, request.response_format)
    skip_special = request.skip_special_tokens if request.skip_special_tokens is not None else True
    prompt_logprobs = request.prompt_logprobs
    if request.echo and request.logprobs is not None and prompt_logprobs is None:
        prompt_logprobs = request.logprobs
    out = []
    for index, prompt in enumerate(prompts):
        max_tokens = renderer.prompts.max_tokens(
            request.max_tokens, len(prompt.token_ids), "max_tokens"
        )
        out.append(
            GenerateRequest(
                request_id=f"cmpl-{base_id}" + (f"-{index}" if len(prompts) > 1 else ""),
                token_ids=prompt.token_ids,
                token_offsets=prompt.offsets,
                sampling_params=request_sampling_params(
                    request,
                    renderer.model.info.sampling_defaults,
                    max_tokens=max_tokens,
                    logprobs=request.logprobs,
                    prompt_logprobs=prompt_logprobs,
                    skip_special_tokens=skip_special,
                    structured=structured,
                    max_n=renderer.settings.max_n_sequences,
                ),
                model=request.model,
                return_token_ids=request.return_token_ids,
                stream=bool(request.stream),
                stream_options=stream_options(request),
                cache_salt=request.cache_salt,
                priority=request.priority,
                kv_transfer_params=request.kv_transfer_params,
                ec_transfer_params=request.ec_transfer_params,
            )
        )
    return out


def _prompts(renderer: Renderer, request: CompletionRequest) -> list[Prompt]:
    prompts = []
    for item in _prompt_items(request.prompt):
        if isinstance(item, str):
            prompts.append(
                renderer.prompts.encode(
                    item,
                    request.add_special_tokens,
                    request.truncate_prompt_tokens,
                    request.truncation_side,
                    bool(request.return_token_offsets),
                )
            )
        else:
            renderer.prompts.check_token_ids(item, "prompt")
            renderer.prompts.check_length(len(item))
            prompts.append(Prompt(item))
    return prompts


def _prompt_items(prompt: str | list[Any] | None) -> list[str | list[int]]:
    """A completion prompt as a list of texts or token-id lists (vLLM's accepted shapes)."""
    if prompt is None:
        raise invalid_param(
            "Either prompt or prompt_embeds must be provided and non-empty.", "prompt"
        )
    if isinstance(prompt, str):
        return [prompt]
    if not prompt:
        raise invalid_param("You must pass at least one prompt", "prompt")
    if all(_is_token_id(t) for t in prompt):
        return [list(prompt)]
    items: list[str | list[int]] = []
    for index, item in enumerate(prompt):
        if isinstance(item, str):
            items.append(item)
        elif isinstance(item, list) and item and all(_is_token_id(t) for t in item):
            items.append(list(item))
        elif isinstance(item, list) and not item:
            raise invalid_param("You must pass at least one prompt", "prompt")
        else:
            raise SchemaError(
                f"1 validation error:\n  {{'loc': 'body.prompt.{index}', 'msg': "
                "'Input should be a string or a list of token ids'}",
                f"body.prompt.{index}",
            )
    return items


def _is_token_id(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)
