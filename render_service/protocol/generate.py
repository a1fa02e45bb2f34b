"""GenerateRequest: what render returns and what /inference/v1/generate accepts (contract §3.7)."""

from __future__ import annotations

from typing import Any

import msgspec


class ReasoningParserKwargs(msgspec.Struct, kw_only=True):
    chat_template_kwargs: dict[str, Any]


class ParseContext(msgspec.Struct, kw_only=True):
    """The parse-relevant subset of a chat request, returned by render for derender to reuse."""

    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = "none"
    parallel_tool_calls: bool | None = True
    include_reasoning: bool = True
    chat_template_kwargs: dict[str, Any] = msgspec.field(default_factory=dict)
    history_tool_call_cnt: int = 0


class GenerateRequest(msgspec.Struct, kw_only=True):
    """Field order is vLLM's, so the JSON reads the same as vLLM's."""

    request_id: str
    token_ids: list[int]
    token_offsets: list[tuple[int, int]] | None = None
    features: dict[str, Any] | None = None
    content_parts: list[dict[str, Any]] | None = None
    sampling_params: dict[str, Any] = msgspec.field(default_factory=dict)
    model: str | None = None
    reasoning_ended: bool | None = None
    reasoning_parser_kwargs: ReasoningParserKwargs | None = None
    return_token_ids: bool | None = None
    output_mode: str = "tokens"
    parse_context: ParseContext | None = None
    stream: bool | None = False
    stream_options: dict[str, Any] | None = None
    cache_salt: str | None = None
    priority: int = 0
    kv_transfer_params: dict[str, Any] | None = None
    ec_transfer_params: dict[str, Any] | None = None
    #: Ours, only when asked for (``X-Derender-Seed: true``): pass it to a stream's first
    #: derender call instead of ``prompt_token_ids`` and ``chat_request``.
    derender_seed: str | msgspec.UnsetType = msgspec.UNSET
