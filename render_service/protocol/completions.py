"""CompletionRequest: the body of /v1/completions/render (vLLM contract §3.2, §3.5)."""

from __future__ import annotations

from typing import Any

from render_service.protocol.sampling import SamplingRequest

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
