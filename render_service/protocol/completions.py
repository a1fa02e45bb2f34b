"""Completions: the body of /v1/completions/render (vLLM contract §3.2, §3.5) and the Completion
and chunk that completions derender answers with (§5), fields in vLLM's order."""

from __future__ import annotations

from typing import Any, Literal

import msgspec

from render_service.protocol.logprobs import CompletionLogProbs
from render_service.protocol.sampling import SamplingRequest
from render_service.protocol.usage import UsageInfo

Prompt = str | list[Any]  # str, list[str], list[int] or list[list[int]]; checked when rendering


class CompletionRequest(SamplingRequest, kw_only=True):
    prompt: Prompt | None = None
    prompt_embeds: str | list[str] | None = None
    model: str | None = None
    echo: bool = False
    logprobs: int | None = None
    max_tokens: int | None = 16
    suffix: str | None = None
    add_special_tokens: bool = True


class CompletionResponseChoice(msgspec.Struct, kw_only=True):
    index: int
    text: str
    logprobs: CompletionLogProbs | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    prompt_logprobs: Any = None
    prompt_token_ids: list[int] | None = None
    token_ids: list[int] | None = None
    routed_experts: None = None
    weight_versions: None = None


class CompletionResponse(msgspec.Struct, kw_only=True):
    """A non-streaming completion (batch derender): one choice per prompt and sample."""

    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionResponseChoice]
    service_tier: None = None
    system_fingerprint: None = None
    usage: UsageInfo
    kv_transfer_params: dict[str, Any] | None = None
    ec_transfer_params: None = None
    metrics: Any = None


class CompletionResponseStreamChoice(msgspec.Struct, kw_only=True):
    index: int
    text: str
    logprobs: CompletionLogProbs | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    prompt_token_ids: list[int] | None = None
    token_ids: list[int] | None = None
    weight_versions: list[dict[str, Any]] | None = None


class CompletionStreamResponse(msgspec.Struct, kw_only=True):
    """One chunk of a streamed completion (streaming derender)."""

    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionResponseStreamChoice]
    usage: UsageInfo | None = None
    system_fingerprint: None = None
    metrics: Any = None
    kv_transfer_params: None = None
