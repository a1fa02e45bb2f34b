"""The render path: chat and completion requests -> GenerateRequest, plus tokenize/detokenize.

Everything here is synchronous and free of HTTP; the app runs it on a worker pool.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import msgspec

from render_service import requests as checks
from render_service import templating
from render_service.errors import InvalidRequest, ModelNotFound, SchemaError, invalid_param
from render_service.model import Model, load_chat_template_arg, load_model
from render_service.multimodal import IMAGE_PLACEHOLDER, MediaBatch, MediaPipeline
from render_service.parsing import ParsingSetup, RenderHints
from render_service.protocol._base import convert
from render_service.protocol.chat import ChatCompletionRequest
from render_service.protocol.completions import CompletionRequest
from render_service.protocol.generate import GenerateRequest, ParseContext, ReasoningParserKwargs
from render_service.protocol.tokenize import (
    DetokenizeRequest,
    TokenizeChatRequest,
    TokenizeCompletionRequest,
)
from render_service.sampling import (
    build_sampling_params,
    resolve_sampling_value,
    structured_outputs,
)
from render_service.sandbox import TemplateSandbox
from render_service.settings import Settings
from render_service.tokenizing import SegmentEncoder

# vLLM always merges its Cohere-only ``--cohere-format`` default into chat_template_kwargs.
_VLLM_DEFAULT_TEMPLATE_KWARGS = {"cohere_format": "cmd4"}


@dataclass(frozen=True)
class Prompt:
    """Rendered prompt ids, with char offsets when asked for."""

    token_ids: list[int]
    offsets: list[tuple[int, int]] | None = None
    features: dict[str, Any] | None = None


class Renderer:
    """Renders requests for one model exactly as vLLM 0.33's render server does."""

    def __init__(self, model: Model, settings: Settings) -> None:
        self.model = model
        self.settings = settings
        self.parsing = ParsingSetup.create(model, settings)
        self._segments = SegmentEncoder(model.backend, settings.segment_cache_entries)
        self.multimodal = MediaPipeline.for_model(model.info.path, settings.model, settings)
        template = model.info.chat_template
        self._content_format = (
            settings.chat_template_content_format
            if settings.chat_template_content_format != "auto"
            else templating.detect_content_format(template or "")
        )
        # Per-request templates render in killable child processes (started on first use).
        self.template_sandbox = (
            TemplateSandbox(
                workers=settings.renderer_num_workers,
                timeout=settings.template_timeout,
                max_output_chars=settings.max_template_output_chars,
                memory_bytes=settings.template_memory_bytes,
            )
            if settings.trust_request_chat_template
            else None
        )

    @classmethod
    def from_pretrained(cls, model: str, **flags: Any) -> Renderer:
        """Load ``model`` (a directory or an offline hub id); flags are Settings fields."""
        settings = Settings(model=model, **flags)
        return cls.from_settings(settings)

    @classmethod
    def from_settings(cls, settings: Settings) -> Renderer:
        template = (
            load_chat_template_arg(settings.chat_template) if settings.chat_template else None
        )
        loaded = load_model(
            settings.model,
            served_model_name=settings.model_name,
            max_model_len=settings.max_model_len,
            chat_template=template,
        )
        return cls(loaded, settings)

    @property
    def model_name(self) -> str:
        return self.model.info.served_model_name

    def check_model(self, name: str | None) -> None:
        if name is not None and name != self.model_name:
            raise ModelNotFound(
                f"The model `{name}` does not exist. Valid aliases: {self.model_name}.", "model"
            )

    # ---- chat -----------------------------------------------------------------------------

    def render_chat(
        self,
        request: ChatCompletionRequest | dict[str, Any],
        *,
        request_id: str | None = None,
        media: MediaBatch | None = None,
    ) -> GenerateRequest:
        """Render a chat request to the GenerateRequest vLLM's render endpoint returns.

        ``media`` is the request's images already processed (``self.multimodal.prepare``);
        without it, images are fetched and processed here, blocking.
        """
        if isinstance(request, dict):
            request = convert(request, ChatCompletionRequest, "body")
        self.check_model(request.model)
        if request.use_beam_search:
            raise InvalidRequest("Beam search is not supported by the render endpoint")
        checks.check_chat_request(request)
        tool_choice = checks.resolve_tool_choice(request)
        self._check_tool_choice_gate(tool_choice)
        tools = [msgspec.to_builtins(t) for t in request.tools] if request.tools else None
        tools = [_tool_dump(t) for t in tools] if tools else None
        kwargs = self.effective_template_kwargs(request)
        reused = _reused_prompt_ids(request.kv_transfer_params)
        if reused is not None:
            prompt = Prompt(reused)
        else:
            template_tools = tools
            if tool_choice == "none" and self.settings.exclude_tools_when_tool_choice_none:
                template_tools = None
            prompt = self._render_messages(request, template_tools, kwargs, media)
        ids = prompt.token_ids
        if not ids:
            raise InvalidRequest("No token_ids rendered")
        max_tokens = self._max_tokens(
            request.max_completion_tokens
            if request.max_completion_tokens is not None
            else request.max_tokens,
            len(ids),
            "max_completion_tokens" if request.max_completion_tokens is not None else "max_tokens",
        )
        parse_context = ParseContext(
            tools=tools,
            tool_choice=tool_choice,
            parallel_tool_calls=request.parallel_tool_calls,
            include_reasoning=request.include_reasoning,
            chat_template_kwargs=kwargs,
            history_tool_call_cnt=_history_tool_calls(request.messages),
        )
        hints = self.parsing.render_hints(parse_context, ids) if self.parsing else RenderHints()
        structured = structured_outputs(request.structured_outputs, request.response_format)
        if hints.structural_tag is not None:
            structured = structured_outputs({"structural_tag": hints.structural_tag}, None)
        skip_special = (
            request.skip_special_tokens if request.skip_special_tokens is not None else True
        )
        if hints.skip_special_tokens is not None:
            skip_special = hints.skip_special_tokens
        logprobs = (
            request.top_logprobs if request.logprobs and request.logprob_token_ids is None else None
        )
        sampling = self._sampling(
            request, max_tokens, logprobs, request.prompt_logprobs, skip_special, structured
        )
        reasoning_ended = hints.reasoning_ended
        if not request.include_reasoning:
            reasoning_ended = True
        base_id = request_id or request.request_id or checks.random_request_id()
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
                if self.parsing is not None and self.parsing.has_reasoning
                else None
            ),
            return_token_ids=request.return_token_ids,
            parse_context=parse_context,
            stream=bool(request.stream),
            stream_options=(
                msgspec.to_builtins(request.stream_options)
                if request.stream and request.stream_options is not None
                else None
            ),
            cache_salt=request.cache_salt,
            priority=request.priority,
            kv_transfer_params=kv_params,
            ec_transfer_params=request.ec_transfer_params,
        )

    def effective_template_kwargs(
        self, request: ChatCompletionRequest | TokenizeChatRequest
    ) -> dict[str, Any]:
        """vLLM's chat_template_kwargs: server defaults < request kwargs < top-level request fields."""
        if isinstance(request, ChatCompletionRequest):
            effort = request.reasoning_effort
            effort_map = self.settings.reasoning_effort_map or {}
            if effort is not None and effort in effort_map:
                effort = effort_map[effort]
        else:
            effort = None
        user_kwargs = dict(request.chat_template_kwargs or {})
        if "chat_template" in user_kwargs and not self.settings.trust_request_chat_template:
            raise _untrusted_template()
        merged: dict[str, Any] = {
            **_VLLM_DEFAULT_TEMPLATE_KWARGS,
            **(self.settings.default_chat_template_kwargs or {}),
        }
        merged.update(user_kwargs)
        merged["add_generation_prompt"] = request.add_generation_prompt
        merged["continue_final_message"] = request.continue_final_message
        if request.documents is not None:
            merged["documents"] = request.documents
        if effort is not None:
            merged["reasoning_effort"] = effort
            if "enable_thinking" not in user_kwargs:
                merged["enable_thinking"] = effort != "none"
        return merged

    def _check_tool_choice_gate(self, tool_choice: str | dict[str, Any]) -> None:
        if self.parsing is not None and self.parsing.has_tools:
            return
        if tool_choice == "auto":
            raise InvalidRequest(
                '"auto" tool choice requires --enable-auto-tool-choice and --tool-call-parser to be set'
            )
        if tool_choice == "required":
            raise InvalidRequest('tool_choice="required" requires --tool-call-parser to be set')
        name = checks.named_tool(tool_choice)
        if name is not None:
            raise InvalidRequest(
                f'tool_choice=function "{name}" requires --tool-call-parser to be set'
            )

    def _template(self, request_template: str | None, kwargs: dict[str, Any]) -> str:
        if request_template is not None or "chat_template" in kwargs:
            if not self.settings.trust_request_chat_template:
                raise _untrusted_template()
            template = request_template or kwargs["chat_template"]
        else:
            template = self.model.info.chat_template
        if template is None:
            raise InvalidRequest(
                "As of transformers v4.44, default chat template is no longer allowed, so you must provide "
                "a chat template if the tokenizer does not define one."
            )
        return str(template)

    def _render_messages(
        self,
        request: ChatCompletionRequest | TokenizeChatRequest,
        tools: list[dict[str, Any]] | None,
        kwargs: dict[str, Any],
        media: MediaBatch | None = None,
    ) -> Prompt:
        template = self._template(request.chat_template, kwargs)
        template_kwargs = {k: v for k, v in kwargs.items() if k != "chat_template"}
        if not request.messages:
            raise InvalidRequest(
                "Cannot apply chat template to an empty conversation. Provide at least one message."
            )
        content_format = self._content_format
        if (
            request.chat_template is not None
            and self.settings.chat_template_content_format == "auto"
        ):
            content_format = templating.detect_content_format(template)
        try:
            conversation = templating.build_conversation(
                request.messages,
                content_format,
                templating.supports_developer_role(template),
                IMAGE_PLACEHOLDER if self.multimodal is not None else None,
            )
        except templating.MultimodalContent as exc:
            raise InvalidRequest(f"{self.model_name} is not a multimodal model") from exc
        untrusted = request.chat_template is not None or "chat_template" in kwargs
        text = templating.apply_template(
            self.model.hf_tokenizer,
            template,
            conversation,
            tools,
            template_kwargs,
            sandbox=self.template_sandbox if untrusted else None,
        )
        truncate = getattr(request, "truncate_prompt_tokens", None)
        side = getattr(request, "truncation_side", None)
        want_offsets = bool(getattr(request, "return_token_offsets", False))
        if self.multimodal is not None and media is None:
            media = self.multimodal.prepare_blocking(request)
        if media is None:
            return self._tokenize(text, request.add_special_tokens, truncate, side, want_offsets)
        prompt = self._tokenize(text, request.add_special_tokens, truncate, side, False)
        ids, features = media.expand(prompt.token_ids)
        self._check_prompt_length(len(ids))
        return Prompt(ids, None, features)

    def _tokenize(
        self,
        text: str,
        add_special_tokens: bool,
        truncate: int | None,
        side: str | None,
        want_offsets: bool,
    ) -> Prompt:
        offsets: list[tuple[int, int]] | None = None
        if add_special_tokens or want_offsets:
            encoding = self.model.backend.encode(text, add_special_tokens=add_special_tokens)
            ids = list(encoding.ids)
            offsets = [(start, end) for start, end in encoding.offsets] if want_offsets else None
        else:
            ids = self._segments.encode(text)
        if truncate is not None:
            keep = self.model.info.max_model_len if truncate == -1 else truncate
            if keep < len(ids):
                cut = slice(len(ids) - keep, None) if (side or "left") == "left" else slice(0, keep)
                ids = ids[cut]
                offsets = offsets[cut] if offsets is not None else None
        self._check_prompt_length(len(ids))
        return Prompt(ids, offsets)

    def _check_prompt_length(self, length: int) -> None:
        limit = self.model.info.max_model_len
        cap = self.settings.max_prompt_tokens
        if cap is not None and cap < limit and length > cap:
            raise invalid_param(
                f"The prompt has {length} tokens, over this server's limit of {cap} "
                "(--max-prompt-tokens).",
                "input_tokens",
                length,
            )
        if length > limit:
            raise invalid_param(
                f"This model's maximum context length is {limit} tokens. However, your prompt contains at "
                f"least {limit + 1} input tokens, which exceeds this limit even without any output tokens. "
                "Please reduce the length of the input prompt.",
                "input_tokens",
                limit + 1,
            )

    def _max_tokens(self, requested: int | None, input_len: int, param: str) -> int:
        limit = self.model.info.max_model_len
        if requested is not None and requested > limit:
            raise invalid_param(
                f"{param}={requested} cannot be greater than max_model_len={limit}. "
                "Please request fewer output tokens.",
                param,
                requested,
            )
        candidates = [limit - input_len]
        if requested is not None:
            candidates.append(requested)
        elif "max_tokens" in self.model.info.sampling_defaults:
            candidates.append(int(self.model.info.sampling_defaults["max_tokens"]))
        value = min(candidates)
        if value < 1:
            raise invalid_param(f"max_tokens must be at least 1, got {value}.", "max_tokens", value)
        return value

    def _sampling(
        self,
        request: ChatCompletionRequest | CompletionRequest,
        max_tokens: int,
        logprobs: int | None,
        prompt_logprobs: int | None,
        skip_special_tokens: bool,
        structured: dict[str, Any] | None,
    ) -> dict[str, Any]:
        defaults = self.model.info.sampling_defaults
        sampling = {
            name: resolve_sampling_value(name, getattr(request, name), defaults)
            for name in (
                "repetition_penalty",
                "presence_penalty",
                "frequency_penalty",
                "temperature",
                "top_p",
                "top_k",
                "min_p",
            )
        }
        extra = dict(request.vllm_xargs) if request.vllm_xargs else None
        return build_sampling_params(
            n=request.n if request.n is not None else 1,
            sampling=sampling,
            seed=request.seed,
            stop=checks.stop_list(request.stop),
            stop_token_ids=list(dict.fromkeys(request.stop_token_ids or [])),
            ignore_eos=request.ignore_eos,
            max_tokens=max_tokens,
            min_tokens=request.min_tokens,
            logprobs=logprobs,
            prompt_logprobs=prompt_logprobs,
            logprob_token_ids=request.logprob_token_ids,
            skip_special_tokens=skip_special_tokens,
            spaces_between_special_tokens=request.spaces_between_special_tokens,
            include_stop_str_in_output=request.include_stop_str_in_output,
            stream=bool(request.stream),
            stream_interval=request.stream_interval,
            structured=structured,
            logit_bias=request.logit_bias,
            allowed_token_ids=request.allowed_token_ids,
            extra_args=extra,
            bad_words=list(request.bad_words),
            thinking_token_budget=getattr(request, "thinking_token_budget", None),
            repetition_detection=request.repetition_detection,
        )

    # ---- completions ----------------------------------------------------------------------

    def render_completion(
        self, request: CompletionRequest | dict[str, Any], *, request_id: str | None = None
    ) -> list[GenerateRequest]:
        """Render a completion request: one GenerateRequest per prompt."""
        if isinstance(request, dict):
            request = convert(request, CompletionRequest, "body")
        self.check_model(request.model)
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
        checks.stop_list(request.stop)
        checks.check_cache_salt(request.cache_salt)
        prompts = self._completion_prompts(request)
        base_id = request_id or request.request_id or checks.random_request_id()
        structured = structured_outputs(request.structured_outputs, request.response_format)
        skip_special = (
            request.skip_special_tokens if request.skip_special_tokens is not None else True
        )
        prompt_logprobs = request.prompt_logprobs
        if request.echo and request.logprobs is not None and prompt_logprobs is None:
            prompt_logprobs = request.logprobs
        out = []
        for index, prompt in enumerate(prompts):
            max_tokens = self._max_tokens(request.max_tokens, len(prompt.token_ids), "max_tokens")
            out.append(
                GenerateRequest(
                    request_id=f"cmpl-{base_id}" + (f"-{index}" if len(prompts) > 1 else ""),
                    token_ids=prompt.token_ids,
                    token_offsets=prompt.offsets,
                    sampling_params=self._sampling(
                        request,
                        max_tokens,
                        request.logprobs,
                        prompt_logprobs,
                        skip_special,
                        structured,
                    ),
                    model=request.model,
                    return_token_ids=request.return_token_ids,
                    stream=bool(request.stream),
                    stream_options=(
                        msgspec.to_builtins(request.stream_options)
                        if request.stream and request.stream_options is not None
                        else None
                    ),
                    cache_salt=request.cache_salt,
                    priority=request.priority,
                    kv_transfer_params=request.kv_transfer_params,
                    ec_transfer_params=request.ec_transfer_params,
                )
            )
        return out

    def _completion_prompts(self, request: CompletionRequest) -> list[Prompt]:
        items = _prompt_items(request.prompt)
        prompts = []
        for item in items:
            if isinstance(item, str):
                prompts.append(
                    self._tokenize(
                        item,
                        request.add_special_tokens,
                        request.truncate_prompt_tokens,
                        request.truncation_side,
                        bool(request.return_token_offsets),
                    )
                )
            else:
                self._check_token_ids(item, "prompt")
                self._check_prompt_length(len(item))
                prompts.append(Prompt(item))
        return prompts

    def _check_token_ids(self, ids: list[int], param: str) -> None:
        vocab = self.model.vocab_size
        for token in ids:
            if token < 0 or token >= vocab:
                raise invalid_param(f"Token id {token} is out of vocabulary", param)

    # ---- tokenize / detokenize ------------------------------------------------------------

    def tokenize(
        self,
        request: TokenizeChatRequest | TokenizeCompletionRequest,
        media: MediaBatch | None = None,
    ) -> dict[str, Any]:
        """``media``: the chat's images already processed, as for ``render_chat``."""
        self.check_model(request.model)
        if isinstance(request, TokenizeChatRequest):
            if request.continue_final_message and request.add_generation_prompt:
                raise InvalidRequest(
                    "Cannot set both `continue_final_message` and `add_generation_prompt` to True."
                )
            checks.check_messages(request.messages)
            kwargs = self.effective_template_kwargs(request)
            prompt = self._render_messages(request, request.tools, kwargs, media)
        else:
            prompt = self._tokenize(request.prompt, request.add_special_tokens, None, None, False)
        ids = prompt.token_ids
        strs = (
            self.model.hf_tokenizer.convert_ids_to_tokens(ids)
            if request.return_token_strs
            else None
        )
        return {
            "count": len(ids),
            "max_model_len": self.model.info.max_model_len,
            "tokens": ids,
            "token_strs": strs,
        }

    def detokenize(self, request: DetokenizeRequest) -> dict[str, Any]:
        self.check_model(request.model)
        vocab = self.model.vocab_size
        ids = [t for t in request.tokens if t < vocab]
        return {"prompt": self.model.decode(ids, skip_special_tokens=False)}


def _untrusted_template() -> InvalidRequest:
    return InvalidRequest(
        "Chat template is passed with request, but --trust-request-chat-template is not set. "
        "Refused request with untrusted chat template."
    )


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
