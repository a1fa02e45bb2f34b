"""Fields that chat and completion requests share: sampling, stopping, output and routing."""

from __future__ import annotations

from typing import Any, Literal

import msgspec

from render_service.protocol._base import Body


class StreamOptions(msgspec.Struct, kw_only=True):
    include_usage: bool | None = False
    continuous_usage_stats: bool | None = False


class SamplingRequest(Body, kw_only=True):
    """What vLLM's ChatCompletionRequest and CompletionRequest have in common (same defaults)."""

    frequency_penalty: float | None = None
    logit_bias: dict[str, float] | None = None
    n: int | None = 1
    presence_penalty: float | None = None
    seed: int | None = None
    stop: str | list[str] | None = msgspec.field(default_factory=list)
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    temperature: float | None = None
    top_p: float | None = None
    user: str | None = None
    use_beam_search: bool = False
    top_k: int | None = None
    min_p: float | None = None
    repetition_penalty: float | None = None
    length_penalty: float = 1.0
    stop_token_ids: list[int] | None = msgspec.field(default_factory=list)
    include_stop_str_in_output: bool = False
    ignore_eos: bool = False
    min_tokens: int = 0
    skip_special_tokens: bool | None = None
    spaces_between_special_tokens: bool = True
    truncate_prompt_tokens: int | None = None
    truncation_side: Literal["left", "right"] | None = None
    prompt_logprobs: int | None = None
    logprob_token_ids: list[int] | None = None
    allowed_token_ids: list[int] | None = None
    bad_words: list[str] = msgspec.field(default_factory=list)
    response_format: dict[str, Any] | None = None
    structured_outputs: dict[str, Any] | None = None
    priority: int = 0
    request_id: str | None = None
    return_token_ids: bool | None = None
    return_token_offsets: bool | None = False
    cache_salt: str | None = None
    kv_transfer_params: dict[str, Any] | None = None
    ec_transfer_params: dict[str, Any] | None = None
    vllm_xargs: dict[str, Any] | None = None
    repetition_detection: dict[str, Any] | None = None
    stream_interval: int | None = None
    watermarking: bool | None = None
