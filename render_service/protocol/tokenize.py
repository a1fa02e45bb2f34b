"""Bodies and answers of /tokenize and /detokenize (vLLM's ServingTokenization)."""

from __future__ import annotations

from typing import Annotated, Any

import msgspec

from render_service.protocol._base import Body


class TokenizeCompletionRequest(Body):
    prompt: str
    model: str | None = None
    add_special_tokens: bool = True
    return_token_strs: bool | None = False


class TokenizeChatRequest(Body):
    messages: list[dict[str, Any]]
    model: str | None = None
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    add_special_tokens: bool = False
    return_token_strs: bool | None = False
    chat_template: str | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    tools: list[dict[str, Any]] | None = None
    documents: list[dict[str, str]] | None = None
    mm_processor_kwargs: dict[str, Any] | None = None


class DetokenizeRequest(Body):
    tokens: list[Annotated[int, msgspec.Meta(ge=0)]]
    model: str | None = None


class TokenizeResponse(msgspec.Struct, kw_only=True):
    count: int
    max_model_len: int
    tokens: list[int]
    token_strs: list[str] | None = None


class DetokenizeResponse(msgspec.Struct, kw_only=True):
    prompt: str
