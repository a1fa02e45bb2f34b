"""Server configuration as one typed value, built by the CLI (vLLM's flag names) and passed down."""

from __future__ import annotations

from typing import Any, Literal

import msgspec


class Settings(msgspec.Struct, frozen=True, kw_only=True):
    model: str
    served_model_name: str | None = None
    max_model_len: int | None = None
    chat_template: str | None = None
    chat_template_content_format: Literal["auto", "string", "openai"] = "auto"
    default_chat_template_kwargs: dict[str, Any] | None = None
    reasoning_effort_map: dict[str, Any] | None = None
    trust_request_chat_template: bool = False
    trust_request_mm_kwargs: bool = False
    exclude_tools_when_tool_choice_none: bool = False
    reasoning_parser: str | None = None
    tool_call_parser: str | None = None
    enable_auto_tool_choice: bool = False
    renderer_num_workers: int = 1
    api_key: str | None = None
    host: str = "127.0.0.1"
    port: int = 8000
    workers: int = 1
    state_secret: str | None = None
    enable_request_id_headers: bool = False
    max_logprobs: int = 20
    max_body_bytes: int = 64 * 1024 * 1024
    max_stream_state_bytes: int = 16384
    parser_cache_entries: int = 4096
    parser_cache_ttl: float = 300.0
    segment_cache_entries: int = 4096
    # Hardening limits (docs/security.md says what each protects); 0 or None turns one off.
    max_messages: int = 2048
    max_tools: int = 256
    max_tool_schema_bytes: int = 1024 * 1024
    max_json_depth: int = 64
    max_prompt_tokens: int | None = None
    max_images: int = 32
    request_timeout: float = 60.0
    template_timeout: float = 5.0
    max_template_output_chars: int = 8 * 1024 * 1024
    template_memory_bytes: int = 512 * 1024 * 1024
    # Multimodal (images): vLLM's flag names where vLLM has one.
    limit_mm_per_prompt: dict[str, Any] | None = None
    mm_processor_kwargs: dict[str, Any] | None = None
    media_io_kwargs: dict[str, dict[str, Any]] | None = None
    allowed_local_media_path: str | None = None
    media_num_workers: int = 1
    media_executor: Literal["process", "thread"] = "thread"
    allow_private_media_urls: bool = False
    media_fetch_timeout: float = 5.0
    max_media_bytes: int = 20 * 1024 * 1024
    max_media_redirects: int = 5
    max_image_pixels: int = 64_000_000
    mm_processor_cache_gb: float = 0.0

    @property
    def model_name(self) -> str:
        return self.served_model_name or self.model
