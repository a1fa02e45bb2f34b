"""Server configuration as one typed value: every option's name, type, default, help text and
valid choices are declared here once; the CLI (vLLM's flag names: ``--field-name``), the library
(``Renderer.from_pretrained(model, field_name=...)``) and docs/deployment.md all follow it."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated, Any, Literal

import msgspec

from parsers import known_reasoning_parsers, known_tool_parsers


@dataclass(frozen=True)
class Option:
    """How an option reads on the command line.

    ``help``: one line. ``choices``: the valid values, where the type does not say (parser
    names). ``env``: a variable read when the flag is not given. ``default``: how the help
    describes a default that is computed (``None`` in the field). ``metavar``: the placeholder.
    """

    help: str
    choices: Callable[[], list[str]] | None = None
    env: str | None = None
    default: str | None = None
    metavar: str | None = None


def reasoning_parser_names() -> list[str]:
    return known_reasoning_parsers()


def tool_parser_names() -> list[str]:
    return known_tool_parsers()


class Settings(msgspec.Struct, frozen=True, kw_only=True):
    model: Annotated[
        str,
        Option(
            "model directory or hub id in the local cache", default="the embedded default model"
        ),
    ]
    tokenizer: Annotated[
        str | None,
        Option("tokenizer (and chat template) directory or cached hub id", default="MODEL"),
    ] = None
    revision: Annotated[
        str | None,
        Option("hub revision of MODEL when it is a cached hub id", default="the cached one"),
    ] = None
    tokenizer_revision: Annotated[
        str | None, Option("hub revision of --tokenizer", default="--revision")
    ] = None
    trust_remote_code: Annotated[
        bool, Option("let transformers run a tokenizer class shipped with the model")
    ] = False
    generation_config: Annotated[
        str,
        Option(
            "sampling defaults: 'auto' (the model's generation_config.json), 'vllm' (none) "
            "or a directory holding one",
            metavar="auto|vllm|DIR",
        ),
    ] = "auto"
    served_model_name: Annotated[
        str | None,
        Option("the name in responses and that requests must use", default="MODEL, or 'default'"),
    ] = None
    max_model_len: Annotated[
        int | None,
        Option("prompt + output bound; may only lower the model's", default="the model's"),
    ] = None
    chat_template: Annotated[
        str | None,
        Option("a template file, or the template text itself", default="the model's"),
    ] = None
    chat_template_content_format: Annotated[
        Literal["auto", "string", "openai"],
        Option("how message content reaches the template"),
    ] = "auto"
    default_chat_template_kwargs: Annotated[
        dict[str, Any] | None,
        Option("JSON object merged under every request's chat_template_kwargs", metavar="JSON"),
    ] = None
    reasoning_effort_map: Annotated[
        dict[str, Any] | None,
        Option("JSON object mapping reasoning_effort values to template kwargs", metavar="JSON"),
    ] = None
    known_chat_templates: Annotated[
        bool,
        Option(
            "render the chat templates of Qwen3 and Qwen2.5 (recognized by their exact text) "
            "with equivalent plain Python; anything it does not cover still goes through the "
            "template"
        ),
    ] = True
    trust_request_chat_template: Annotated[
        bool, Option("let requests carry their own chat template")
    ] = False
    trust_request_mm_kwargs: Annotated[
        bool, Option("let requests carry multimodal processor kwargs")
    ] = False
    exclude_tools_when_tool_choice_none: Annotated[
        bool, Option("leave tools out of the prompt when tool_choice is none")
    ] = False
    reasoning_parser: Annotated[
        str | None,
        Option("reasoning parser family for derender", choices=reasoning_parser_names),
    ] = None
    tool_call_parser: Annotated[
        str | None,
        Option("tool-call parser family for derender", choices=tool_parser_names),
    ] = None
    tool_strict_level: Annotated[
        Literal["auto", "function", "parameter"] | None,
        Option(
            "floor for the tool constraints of render's structural tag", default="the tool parser's"
        ),
    ] = None
    enable_auto_tool_choice: Annotated[
        bool, Option("enable the tool-call parser (needs --tool-call-parser)")
    ] = False
    tokenizer_mode: Annotated[
        Literal["auto", "hf", "slow", "mistral"],
        Option(
            "mistral: the model's tekken.json and Mistral's request format through "
            "mistral-common (the mistral extra); the others load the Hugging Face tokenizer"
        ),
    ] = "auto"
    renderer_num_workers: Annotated[
        int, Option("worker threads per process for render and derender work")
    ] = 1
    api_key: Annotated[
        str | None,
        Option(
            "require 'Authorization: Bearer KEY' on /v1, /v2 and /inference paths",
            env="VLLM_API_KEY",
        ),
    ] = None
    host: Annotated[str, Option("address to bind")] = "127.0.0.1"
    port: Annotated[int, Option("port to bind")] = 8000
    workers: Annotated[
        int | None, Option("server processes sharing the port", default="one per core")
    ] = None
    log_level: Annotated[
        Literal["critical", "error", "warning", "info", "debug"],
        Option("info writes a JSON access line per request; debug adds the probes"),
    ] = "info"
    state_secret: Annotated[
        str | None,
        Option(
            "HMAC secret for derender stream_state (give every replica the same)",
            env="RENDER_SERVICE_STATE_SECRET",
        ),
    ] = None
    system_start_date: Annotated[
        str | None,
        Option(
            "the date gpt-oss (Harmony) prompts give as 'Current date', e.g. 2026-01-01",
            env="VLLM_SYSTEM_START_DATE",
            default="the day of each request",
        ),
    ] = None
    max_logprobs: Annotated[
        int, Option("most logprob candidates per position in a derendered output (-1: any)")
    ] = 20
    max_n_sequences: Annotated[
        int,
        Option(
            "most choices per request and per derendered response, as vLLM's variable",
            env="VLLM_MAX_N_SEQUENCES",
            default="16384",
        ),
    ] = 16384
    max_body_bytes: Annotated[int, Option("request bodies above this are refused (413)")] = (
        64 * 1024 * 1024
    )
    max_stream_state_bytes: Annotated[
        int, Option("longest stream_state accepted or issued, in characters")
    ] = 16384
    parser_cache_entries: Annotated[
        int, Option("live stream states kept per process for the next chunk (0: off)")
    ] = 4096
    parser_cache_ttl: Annotated[
        float, Option("seconds a cached stream state lives after its last chunk")
    ] = 300.0
    parser_cache_bytes: Annotated[
        int, Option("memory budget of the cached stream states per process, in bytes")
    ] = 64 * 1024 * 1024
    stream_constants_cache_bytes: Annotated[
        int,
        Option(
            "memory budget of the verified constant parts of stream states per process, in "
            "bytes (0: off)"
        ),
    ] = 32 * 1024 * 1024
    segment_cache_entries: Annotated[
        int,
        Option(
            "prompt text stretches (and chunks of long ones) whose ids are kept per process "
            "(0: off)"
        ),
    ] = 65536
    segment_cache_bytes: Annotated[
        int, Option("memory budget of the cached prompt stretches per process, in bytes")
    ] = 64 * 1024 * 1024
    small_cache_bytes: Annotated[
        int,
        Option(
            "memory budget, in bytes, of each smaller per-process cache (parsers by tool set, "
            "parsed and compiled templates, logprob token texts)"
        ),
    ] = 16 * 1024 * 1024
    max_vllm_stream_state_bytes: Annotated[
        int | None,
        Option(
            "largest vLLM-format stream_state object accepted, in JSON bytes",
            default="32 x max_model_len",
        ),
    ] = None
    # HTTP connection limits, per server process (docs/security.md).
    max_header_bytes: Annotated[
        int, Option("request line and headers of one request, in bytes (431 above)")
    ] = 64 * 1024
    max_headers: Annotated[int, Option("headers per request (431 above)")] = 100
    header_timeout: Annotated[
        float, Option("seconds a connection may take to send a request's headers")
    ] = 10.0
    max_connections: Annotated[
        int, Option("open connections per server process (503 and close above)")
    ] = 1024
    # Hardening limits (docs/security.md says what each protects); 0 or None turns one off.
    max_messages: Annotated[int, Option("messages per chat request (0: no limit)")] = 2048
    max_tools: Annotated[int, Option("tools per chat request (0: no limit)")] = 256
    max_tool_schema_bytes: Annotated[
        int, Option("total JSON bytes of a request's tool definitions")
    ] = 1024 * 1024
    max_json_depth: Annotated[
        int, Option("nesting depth of messages, tools and template kwargs")
    ] = 64
    max_prompt_tokens: Annotated[
        int | None, Option("prompt tokens per request", default="--max-model-len")
    ] = None
    max_images: Annotated[int, Option("images per request")] = 32
    request_timeout: Annotated[
        float, Option("seconds a request may run before a clean 408 (0: no limit)")
    ] = 60.0
    template_timeout: Annotated[float, Option("seconds a per-request chat template may run")] = 5.0
    max_template_output_chars: Annotated[
        int, Option("characters a per-request chat template may produce")
    ] = 8 * 1024 * 1024
    template_memory_bytes: Annotated[
        int, Option("address-space budget of the per-request template worker")
    ] = 512 * 1024 * 1024
    # Multimodal (images): vLLM's flag names where vLLM has one.
    limit_mm_per_prompt: Annotated[
        dict[str, Any] | None,
        Option(
            'most items per prompt, e.g. {"image": 4}', default='{"image": 999}', metavar="JSON"
        ),
    ] = None
    mm_processor_kwargs: Annotated[
        dict[str, Any] | None,
        Option("server-wide image processor overrides", metavar="JSON"),
    ] = None
    media_io_kwargs: Annotated[
        dict[str, dict[str, Any]] | None,
        Option("server-wide image loading options", metavar="JSON"),
    ] = None
    allowed_local_media_path: Annotated[
        str | None, Option("directory that file: image URLs may read")
    ] = None
    media_num_workers: Annotated[
        int | None,
        Option("workers that decode and process images", default="one per core"),
    ] = None
    media_executor: Annotated[
        Literal["process", "thread"], Option("run image work in threads or worker processes")
    ] = "thread"
    allow_private_media_urls: Annotated[
        bool, Option("fetch image URLs on loopback, private and link-local addresses")
    ] = False
    media_fetch_timeout: Annotated[
        float, Option("seconds to connect and per read when fetching an image")
    ] = 5.0
    max_media_bytes: Annotated[int, Option("largest image download or file")] = 20 * 1024 * 1024
    max_media_redirects: Annotated[int, Option("redirects followed per image URL")] = 5
    max_image_pixels: Annotated[
        int, Option("largest image (width x height), checked before decoding")
    ] = 64_000_000
    mm_processor_cache_gb: Annotated[
        float, Option("GiB of processed images kept per process for reuse (0: off)")
    ] = 0.0

    def __post_init__(self) -> None:
        for name, value, known in (
            ("--reasoning-parser", self.reasoning_parser, reasoning_parser_names),
            ("--tool-call-parser", self.tool_call_parser, tool_parser_names),
        ):
            if value not in (None, "", "none") and value not in known():
                raise ValueError(
                    f"{name} {value!r} is not implemented; valid names: {', '.join(known())}"
                )
        if self.enable_auto_tool_choice and not self.tool_call_parser:
            raise ValueError("--enable-auto-tool-choice requires --tool-call-parser")

    @property
    def model_name(self) -> str:
        return self.served_model_name or self.model

    @property
    def server_workers(self) -> int:
        """``workers``, or one per core."""
        return self.workers or max(1, os.cpu_count() or 1)

    @property
    def media_workers(self) -> int:
        """``media_num_workers``, or one per core."""
        return self.media_num_workers or max(1, os.cpu_count() or 1)


#: Each option's default, by field name (for values built from Settings, e.g. the limits).
DEFAULTS: dict[str, Any] = {
    f.name: f.default
    for f in msgspec.structs.fields(Settings)
    if f.default is not msgspec.NODEFAULT
}
