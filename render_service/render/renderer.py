"""``Renderer``: one model's render path (chat, completions, tokenize, detokenize) as a library.

Everything here is synchronous and free of HTTP; the app runs it on a worker pool.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Self

from render_service.apis import messages as messages_api
from render_service.caches import CacheSize
from render_service.errors import InvalidRequest
from render_service.model import chat_jinja, known_templates, templating
from render_service.model.loading import Model, load_chat_template_arg, load_model
from render_service.model.parser_setup import ParsingSetup
from render_service.model.sandbox import TemplateSandbox
from render_service.multimodal import media_pipeline
from render_service.protocol.chat import ChatCompletionRequest
from render_service.protocol.completions import CompletionRequest
from render_service.protocol.generate import GenerateRequest
from render_service.protocol.messages import AnthropicMessagesRequest
from render_service.protocol.responses import ResponsesRequest
from render_service.protocol.tokenize import (
    DetokenizeRequest,
    DetokenizeResponse,
    TokenizeChatRequest,
    TokenizeCompletionRequest,
    TokenizeResponse,
)
from render_service.render import chat, completion, conversation, messages, responses
from render_service.render.conversation import Extension, LossMask
from render_service.render.prompt import PromptEncoder
from render_service.render.request_checks import check_messages
from render_service.settings import Settings
from render_service.validation import convert

if TYPE_CHECKING:
    from render_service.multimodal.pipeline import MediaBatch


class Renderer:
    """Renders requests for one model exactly as vLLM 0.33's render server does."""

    def __init__(self, model: Model, settings: Settings) -> None:
        self.model = model
        self.settings = settings
        self.parsing = ParsingSetup.create(model, settings)
        self.prompts = PromptEncoder(model, settings)
        self.template_probes = messages_api.TemplateProbes(model, settings)
        self.multimodal = media_pipeline(model.info.path, settings.model, settings)
        templating.TEMPLATE_FACTS.resize(settings.small_cache_bytes)
        chat_jinja.COMPILED.resize(settings.small_cache_bytes)
        known_templates.TOOL_BLOCKS.resize(settings.small_cache_bytes)
        template = model.info.chat_template
        # The model's own template in plain Python when it is one we know exactly.
        self.known_template = (
            known_templates.known_template(template) if settings.known_chat_templates else None
        )
        self.content_format = (
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
    def from_pretrained(cls, model: str, **flags: Any) -> Self:
        """Load ``model`` (a directory or an offline hub id); flags are Settings fields."""
        settings = Settings(model=model, **flags)
        return cls.from_settings(settings)

    @classmethod
    def from_settings(cls, settings: Settings) -> Self:
        template = (
            load_chat_template_arg(settings.chat_template) if settings.chat_template else None
        )
        loaded = load_model(
            settings.model,
            served_model_name=settings.model_name,
            max_model_len=settings.max_model_len,
            chat_template=template,
            tokenizer=settings.tokenizer,
            revision=settings.revision,
            tokenizer_revision=settings.tokenizer_revision,
            trust_remote_code=settings.trust_remote_code,
            generation_config=settings.generation_config,
            tokenizer_mode=settings.tokenizer_mode,
        )
        return cls(loaded, settings)

    def caches(self) -> list[CacheSize]:
        """The size of every per-process cache of this renderer and its derender setup."""
        segments = self.prompts.segments
        sizes = [
            templating.TEMPLATE_FACTS.size(),
            chat_jinja.COMPILED.size(),
            known_templates.TOOL_BLOCKS.size(),
        ]
        if segments is not None:  # none in Mistral mode (tekken encodes whole prompts)
            sizes.insert(0, CacheSize(name="segments", entries=len(segments), bytes=segments.bytes))
        if self.parsing is not None:
            sizes.append(self.parsing.parsers.size())
        if self.multimodal is not None:
            sizes += self.multimodal.caches()
        return sizes

    @property
    def model_name(self) -> str:
        return self.model.info.served_model_name

    def close(self) -> None:
        """Stop the threads and processes this renderer started (encoder, templates, images)."""
        self.prompts.close()
        if self.template_sandbox is not None:
            self.template_sandbox.close()
        if self.multimodal is not None:
            self.multimodal.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

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
        return chat.render_chat(self, request, request_id=request_id, media=media)

    def render_completion(
        self, request: CompletionRequest | dict[str, Any], *, request_id: str | None = None
    ) -> list[GenerateRequest]:
        """Render a completion request: one GenerateRequest per prompt."""
        return completion.render_completion(self, request, request_id=request_id)

    def render_messages(
        self, request: AnthropicMessagesRequest | dict[str, Any], *, request_id: str | None = None
    ) -> GenerateRequest:
        """Render an Anthropic Messages request as vLLM does: converted to chat, then chat render."""
        if isinstance(request, dict):
            request = convert(request, AnthropicMessagesRequest, "body")
        return messages.render_messages(self, request, request_id=request_id)

    def render_responses(self, request: ResponsesRequest | dict[str, Any]) -> GenerateRequest:
        """Render an OpenAI Responses request as vLLM's stateless render endpoint does."""
        if isinstance(request, dict):
            request = convert(request, ResponsesRequest, "body")
        return responses.render_responses(self, request)

    def tokenize(
        self,
        request: TokenizeChatRequest | TokenizeCompletionRequest | dict[str, Any],
        media: MediaBatch | None = None,
    ) -> TokenizeResponse:
        """The prompt's ids (``media``: the chat's images already processed, as for render).

        A dict is read as the /tokenize body: chat-style with ``messages``, else ``prompt``.
        """
        if isinstance(request, dict):
            kind: type[TokenizeChatRequest | TokenizeCompletionRequest] = (
                TokenizeChatRequest if "messages" in request else TokenizeCompletionRequest
            )
            request = convert(request, kind, "body")
        self.model.check_name(request.model)
        if isinstance(request, TokenizeChatRequest):
            if request.continue_final_message and request.add_generation_prompt:
                raise InvalidRequest(
                    "Cannot set both `continue_final_message` and `add_generation_prompt` to True."
                )
            check_messages(request.messages)
            kwargs = templating.template_kwargs(request, self.settings)
            prompt = chat.render_messages(self, request, request.tools, kwargs, media)
        else:
            prompt = self.prompts.encode(
                request.prompt, request.add_special_tokens, None, None, False
            )
        ids = prompt.token_ids
        strs = self.model.token_strs(ids) if request.return_token_strs else None
        return TokenizeResponse(
            count=len(ids),
            max_model_len=self.model.info.max_model_len,
            tokens=ids,
            token_strs=strs,
        )

    def detokenize(self, request: DetokenizeRequest | dict[str, Any]) -> DetokenizeResponse:
        """The text of the ids (ids outside the vocabulary are dropped, as vLLM's HF path does)."""
        if isinstance(request, dict):
            request = convert(request, DetokenizeRequest, "body")
        self.model.check_name(request.model)
        vocab = self.model.vocab_size
        if self.model.mistral is not None:
            # vLLM's tekken decode fails with a 500 here; an unknown id is bad input.
            self.prompts.check_token_ids(request.tokens, "tokens")
            return DetokenizeResponse(
                prompt=self.model.decode(request.tokens, skip_special_tokens=False)
            )
        ids = [t for t in request.tokens if t < vocab]
        return DetokenizeResponse(prompt=self.model.decode(ids, skip_special_tokens=False))

    # ---- multi-turn training (render_service.render.conversation) --------------------------

    def extend(
        self,
        conversation_ids: list[int],
        new_messages: list[dict[str, Any]],
        request: ChatCompletionRequest | dict[str, Any],
    ) -> Extension:
        """``conversation_ids`` verbatim, then ``new_messages`` and the next generation prompt
        as the template renders them; ``request.messages`` is the conversation so far."""
        return conversation.extend(self, conversation_ids, new_messages, request)

    def loss_mask(self, request: ChatCompletionRequest | dict[str, Any]) -> LossMask:
        """The conversation's ids with, per token, its message and whether it is trainable."""
        return conversation.loss_mask(self, request)
