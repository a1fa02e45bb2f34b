"""Chat requests -> GenerateRequest: checks, the chat template, tokenization, parser hints."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import msgspec

from parsers.harmony import harmony_output_tag, harmony_tools_tag
from render_service.errors import InvalidRequest, invalid_param
from render_service.model import templating
from render_service.model.mistral import MistralTokenizer, MistralTokenizerError
from render_service.model.parser_setup import (
    ParsingSetup,
    RenderHints,
    named_tool,
    resolve_tool_choice,
)
from render_service.protocol.chat import ChatCompletionRequest
from render_service.protocol.generate import GenerateRequest, ParseContext, ReasoningParserKwargs
from render_service.protocol.tokenize import TokenizeChatRequest
from render_service.render.harmony import render_harmony
from render_service.render.prompt import Prompt
from render_service.render.request_checks import (
    base_request_id,
    check_cache_salt,
    check_chat_request,
    check_messages,
)
from render_service.render.sampling import (
    request_sampling_params,
    stream_options,
    structured_outputs,
)
from render_service.validation import convert, stop_strings

if TYPE_CHECKING:
    from render_service.multimodal.pipeline import MediaBatch
    from render_service.render.renderer import Renderer


def render_chat(
    renderer: Renderer,
    request: ChatCompletionRequest | dict[str, Any],
    *,
    request_id: str | None = None,
    media: MediaBatch | None = None,
    converted: bool = False,
) -> GenerateRequest:
    """Render a chat request to the GenerateRequest vLLM's render endpoint returns.

    ``converted``: the request was converted from a Messages request, whose tool fields vLLM
    sets after validation, so the chat request's tool checks do not run and a null
    ``tool_choice`` stays null.
    """
    if isinstance(request, dict):
        request = convert(request, ChatCompletionRequest, "body")
    renderer.model.check_name(request.model)
    if request.use_beam_search:
        raise InvalidRequest("Beam search is not supported by the render endpoint")
    if converted:
        check_messages(request.messages)
        stop_strings(request.stop)
        check_cache_salt(request.cache_salt)
    else:
        check_chat_request(request)
    if renderer.model.mistral is not None:
        _check_mistral_request(request)
    tool_choice = resolve_tool_choice(request)
    harmony = renderer.model.harmony
    if harmony is None:
        # vLLM's Harmony path lets any tool choice through (its tool calls vanish without a parser).
        _check_tool_choice_gate(renderer, tool_choice)
    if converted:
        _check_named_tool(renderer, tool_choice, request)
    tools = [msgspec.to_builtins(t) for t in request.tools] if request.tools else None
    tools = [_tool_dump(t) for t in tools] if tools else None
    kwargs = templating.template_kwargs(request, renderer.settings)
    reused = _reused_prompt_ids(request.kv_transfer_params)
    if reused is not None:
        prompt = Prompt(reused)
    else:
        shown = _shown_tools(renderer, tool_choice, tools)
        prompt = render_messages(renderer, request, shown, kwargs, media)
    ids = prompt.token_ids
    if not ids:
        raise InvalidRequest("No token_ids rendered")
    input_len = len(ids)
    truncate = request.truncate_prompt_tokens
    if truncate is not None:
        # vLLM budgets for the truncated length even where it did not truncate (Harmony).
        input_len = min(
            input_len, renderer.model.info.max_model_len if truncate == -1 else truncate
        )
    max_tokens = renderer.prompts.max_tokens(
        request.max_completion_tokens
        if request.max_completion_tokens is not None
        else request.max_tokens,
        input_len,
        "max_completion_tokens" if request.max_completion_tokens is not None else "max_tokens",
        clamp=harmony is not None,
    )
    parse_context = ParseContext(
        tools=tools,
        tool_choice=None if converted and request.tool_choice is None else tool_choice,
        parallel_tool_calls=request.parallel_tool_calls,
        include_reasoning=request.include_reasoning,
        # vLLM parses Harmony output without template kwargs.
        chat_template_kwargs=kwargs if harmony is None else {},
        history_tool_call_cnt=_history_tool_calls(request.messages),
    )
    parsing = renderer.parsing
    hints = parsing.render_hints(parse_context, ids) if parsing else RenderHints()
    structured = structured_outputs(request.structured_outputs, request.response_format)
    if harmony is not None and parsing is not None:
        structured = harmony_structured(parsing, parse_context, structured)
    elif hints.structural_tag is not None:
        structured = structured_outputs({"structural_tag": hints.structural_tag}, None)
    elif hints.json_schema is not None and not (structured or {}).get("structural_tag"):
        # vLLM's forced tool choice without a structural tag: the call list's schema replaces
        # structured outputs and response_format.
        structured = structured_outputs({"json": hints.json_schema}, None)
    skip_special = request.skip_special_tokens if request.skip_special_tokens is not None else True
    if hints.skip_special_tokens is not None:
        skip_special = hints.skip_special_tokens
    logprobs = (
        request.top_logprobs if request.logprobs and request.logprob_token_ids is None else None
    )
    sampling = request_sampling_params(
        request,
        renderer.model.info.sampling_defaults,
        max_tokens=max_tokens,
        logprobs=logprobs,
        prompt_logprobs=request.prompt_logprobs,
        skip_special_tokens=skip_special,
        structured=structured,
        max_n=renderer.settings.max_n_sequences,
    )
    reasoning_ended = hints.reasoning_ended
    if not request.include_reasoning:
        reasoning_ended = True
    base_id = base_request_id(request_id, request.request_id)
    kv_params = (
        _without_prompt_ids(request.kv_transfer_params)
        if reused is not None
        else request.kv_transfer_params
    )
    return GenerateRequest(
        request_id=f"chatcmpl-{base_id}",
        token_ids=ids,
        token_offsets=prompt.offsets,
        features=prompt.features,
        sampling_params=sampling,
        model=request.model,
        reasoning_ended=reasoning_ended,
        reasoning_parser_kwargs=(
            ReasoningParserKwargs(chat_template_kwargs=kwargs)
            if parsing is not None and parsing.has_reasoning
            else None
        ),
        return_token_ids=request.return_token_ids,
        parse_context=parse_context,
        stream=bool(request.stream),
        stream_options=stream_options(request),
        cache_salt=request.cache_salt,
        priority=request.priority,
        kv_transfer_params=kv_params,
        ec_transfer_params=request.ec_transfer_params,
    )


def template_tools(
    renderer: Renderer, request: ChatCompletionRequest
) -> list[dict[str, Any]] | None:
    """The tools the chat template sees for ``request``, as render_chat passes them."""
    tools = [_tool_dump(msgspec.to_builtins(t)) for t in request.tools] if request.tools else None
    return _shown_tools(renderer, resolve_tool_choice(request), tools)


def _shown_tools(
    renderer: Renderer, tool_choice: str | dict[str, Any], tools: list[dict[str, Any]] | None
) -> list[dict[str, Any]] | None:
    if tool_choice == "none" and renderer.settings.exclude_tools_when_tool_choice_none:
        return None
    return tools


def render_messages(
    renderer: Renderer,
    request: ChatCompletionRequest | TokenizeChatRequest,
    tools: list[dict[str, Any]] | None,
    kwargs: dict[str, Any],
    media: MediaBatch | None = None,
) -> Prompt:
    """The chat's prompt: messages through the chat template, tokenized, images expanded.

    ``media`` is the request's images already processed (``renderer.multimodal.prepare``);
    without it, images are fetched and processed here, blocking. Harmony models (gpt-oss) are
    rendered with the Harmony encoding instead of a template, as vLLM does; with
    `--tokenizer-mode mistral`, Mistral's own request format is.
    """
    if renderer.model.mistral is not None:
        return _render_mistral(renderer, renderer.model.mistral, request, tools)
    harmony = renderer.model.harmony
    if harmony is not None:
        ids = render_harmony(
            harmony,
            request.messages,
            tools=tools,
            reasoning_effort=templating.reasoning_effort(request, renderer.settings),
            start_date=renderer.settings.system_start_date,
        )
        renderer.prompts.check_length(len(ids))
        return Prompt(ids)
    text = prompt_text(renderer, request, tools, kwargs)
    truncate = getattr(request, "truncate_prompt_tokens", None)
    side = getattr(request, "truncation_side", None)
    want_offsets = bool(getattr(request, "return_token_offsets", False))
    multimodal = renderer.multimodal
    if multimodal is not None and media is None:
        media = multimodal.prepare_blocking(request)
    encode = renderer.prompts.encode
    if media is None:
        return encode(text, request.add_special_tokens, truncate, side, want_offsets)
    prompt = encode(text, request.add_special_tokens, truncate, side, False)
    ids, features = media.expand(prompt.token_ids)
    renderer.prompts.check_length(len(ids))
    return Prompt(ids, None, features)


def prompt_text(
    renderer: Renderer,
    request: ChatCompletionRequest | TokenizeChatRequest,
    tools: list[dict[str, Any]] | None,
    kwargs: dict[str, Any],
) -> str:
    """The request's messages through the chat template (``kwargs``: template_kwargs)."""
    template = _template(renderer, request.chat_template, kwargs)
    template_kwargs = {k: v for k, v in kwargs.items() if k != "chat_template"}
    if not request.messages:
        raise InvalidRequest(
            "Cannot apply chat template to an empty conversation. Provide at least one message."
        )
    settings = renderer.settings
    content_format = renderer.content_format
    if request.chat_template is not None and settings.chat_template_content_format == "auto":
        content_format = templating.detect_content_format(template)
    multimodal = renderer.multimodal
    try:
        conversation = templating.build_conversation(
            request.messages,
            content_format,
            templating.supports_developer_role(template),
            multimodal.placeholder if multimodal is not None else None,
        )
    except templating.MultimodalContent as exc:
        raise InvalidRequest(f"{renderer.model_name} is not a multimodal model") from exc
    untrusted = request.chat_template is not None or "chat_template" in kwargs
    return templating.apply_template(
        renderer.model.special_tokens_map,
        template,
        conversation,
        tools,
        template_kwargs,
        sandbox=renderer.template_sandbox if untrusted else None,
        # Without a template of the request's own, the template is the model's.
        known=None if untrusted else renderer.known_template,
    )


def harmony_structured(
    parsing: ParsingSetup, context: ParseContext, structured: dict[str, Any] | None
) -> dict[str, Any] | None:
    """vLLM's Harmony adjust_request: structured outputs move into a structural tag on the final
    channel; with a tool parser, a tool-call tag replaces them when calls are constrained."""
    structured = harmony_output_tag(structured)
    request = parsing.parse_request(context)
    parser = parsing.parser(request)
    if not parsing.has_tools or parser is None:
        return structured
    tag = harmony_tools_tag(structured, request, parser.tool_strict_level)
    return structured if tag is None else structured_outputs({"structural_tag": tag}, None)


def _check_mistral_request(request: ChatCompletionRequest) -> None:
    """vLLM's checks before Mistral's own request format (`validate_request_params`)."""
    # (vLLM also checks reasoning_effort against mistral-common's values, which are exactly
    # the values the request schema accepts.)
    if request.chat_template is not None or request.chat_template_kwargs is not None:
        raise invalid_param(
            "chat_template is not supported for Mistral tokenizers.", "chat_template"
        )


def _render_mistral(
    renderer: Renderer,
    mistral: MistralTokenizer,
    request: ChatCompletionRequest | TokenizeChatRequest,
    tools: list[dict[str, Any]] | None,
) -> Prompt:
    """The prompt in Mistral's own request format (`--tokenizer-mode mistral`)."""
    if not request.messages:
        raise InvalidRequest(
            "Cannot apply chat template to an empty conversation. Provide at least one message."
        )
    try:  # the same content checks as the template path (images on a text model, ...)
        templating.build_conversation(request.messages, "string", True, None)
    except templating.MultimodalContent as exc:
        raise InvalidRequest(f"{renderer.model_name} is not a multimodal model") from exc
    try:
        ids = mistral.encode_chat(
            request.messages,
            tools,
            add_generation_prompt=request.add_generation_prompt,
            continue_final_message=request.continue_final_message,
        )
    except MistralTokenizerError as exc:
        raise InvalidRequest(str(exc)) from exc
    truncate = getattr(request, "truncate_prompt_tokens", None)
    side = getattr(request, "truncation_side", None)
    return renderer.prompts.finish(ids, None, truncate, side)


def _check_tool_choice_gate(renderer: Renderer, tool_choice: str | dict[str, Any]) -> None:
    if renderer.parsing is not None and renderer.parsing.has_tools:
        return
    if tool_choice == "auto":
        raise InvalidRequest(
            '"auto" tool choice requires --enable-auto-tool-choice and --tool-call-parser to be set'
        )
    if tool_choice == "required":
        raise InvalidRequest('tool_choice="required" requires --tool-call-parser to be set')
    name = named_tool(tool_choice)
    if name is not None:
        raise InvalidRequest(f'tool_choice=function "{name}" requires --tool-call-parser to be set')


def _check_named_tool(
    renderer: Renderer, tool_choice: str | dict[str, Any], request: ChatCompletionRequest
) -> None:
    """xgrammar's refusal of a named tool choice that names no tool (vLLM's structural tag)."""
    name = named_tool(tool_choice)
    parsing = renderer.parsing
    if name is None or parsing is None or not parsing.has_tools:
        return
    if not any(tool.function.name == name for tool in request.tools or []):
        raise InvalidRequest(f"The tool with name '{name}' is not found in the tools list.")


def _template(renderer: Renderer, request_template: str | None, kwargs: dict[str, Any]) -> str:
    if request_template is not None or "chat_template" in kwargs:
        if not renderer.settings.trust_request_chat_template:
            raise templating.untrusted_template()
        template = request_template or kwargs["chat_template"]
    else:
        template = renderer.model.info.chat_template
    if template is None:
        raise InvalidRequest(
            "As of transformers v4.44, default chat template is no longer allowed, so you must provide "
            "a chat template if the tokenizer does not define one."
        )
    return str(template)


def _tool_dump(tool: dict[str, Any]) -> dict[str, Any]:
    """ChatCompletionToolsParam.model_dump(): description/parameters always present, strict only if given."""
    function = tool["function"]
    dumped = {
        "name": function["name"],
        "description": function.get("description"),
        "parameters": function.get("parameters"),
    }
    if "strict" in function:
        dumped["strict"] = function["strict"]
    return {"type": tool.get("type", "function"), "function": dumped}


def _history_tool_calls(messages: list[dict[str, Any]]) -> int:
    return sum(
        len(m["tool_calls"])
        for m in messages
        if m.get("role") == "assistant" and isinstance(m.get("tool_calls"), list)
    )


def _reused_prompt_ids(kv_params: dict[str, Any] | None) -> list[int] | None:
    """Decode-side reuse: a P/D connector hands back the prefill's prompt ids."""
    if not kv_params or "prompt_token_ids" not in kv_params:
        return None
    ids = kv_params["prompt_token_ids"]
    if (
        not isinstance(ids, list)
        or not ids
        or not all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in ids)
    ):
        raise invalid_param(
            "`kv_transfer_params['prompt_token_ids']` must be a non-empty list of non-negative integers.",
            "kv_transfer_params.prompt_token_ids",
        )
    return list(ids)


def _without_prompt_ids(kv_params: dict[str, Any] | None) -> dict[str, Any] | None:
    if kv_params is None:
        return None
    return {k: v for k, v in kv_params.items() if k != "prompt_token_ids"}
