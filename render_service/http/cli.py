"""``render-service serve MODEL [flags]``: vLLM's flag names, turned into one Settings value."""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from typing import Any

from render_service.settings import Settings

STATE_SECRET_ENV = "RENDER_SERVICE_STATE_SECRET"


def _json_dict(value: str) -> dict[str, Any]:
    try:
        parsed = json.loads(value)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"not valid JSON: {exc}") from exc
    if not isinstance(parsed, dict):
        raise argparse.ArgumentTypeError("expected a JSON object")
    return parsed


def _bool_flag(parser: argparse.ArgumentParser, name: str, help_text: str) -> None:
    parser.add_argument(name, action=argparse.BooleanOptionalAction, default=False, help=help_text)


def build_parser() -> argparse.ArgumentParser:
    # "@FILE" reads more arguments from FILE, one per line (how docker/k8s passes a ConfigMap).
    parser = argparse.ArgumentParser(
        prog="render-service", description=__doc__, fromfile_prefix_chars="@"
    )
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="serve one model over HTTP")
    serve.add_argument(
        "model", nargs="?", default=None, help="model directory or hub id (default: embedded model)"
    )
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, default=8000)
    serve.add_argument("--served-model-name", default=None)
    serve.add_argument("--max-model-len", type=int, default=None)
    serve.add_argument(
        "--chat-template", default=None, help="path to a template file, or the template itself"
    )
    serve.add_argument(
        "--chat-template-content-format", choices=["auto", "string", "openai"], default="auto"
    )
    serve.add_argument("--default-chat-template-kwargs", type=_json_dict, default=None)
    serve.add_argument("--reasoning-effort-map", type=_json_dict, default=None)
    _bool_flag(serve, "--trust-request-chat-template", "allow per-request chat templates")
    _bool_flag(serve, "--trust-request-mm-kwargs", "allow per-request multimodal processor kwargs")
    _bool_flag(
        serve,
        "--exclude-tools-when-tool-choice-none",
        "leave tools out of the prompt for tool_choice=none",
    )
    serve.add_argument("--reasoning-parser", default=None)
    serve.add_argument("--tool-call-parser", default=None)
    _bool_flag(serve, "--enable-auto-tool-choice", "enable the tool-call parser")
    serve.add_argument(
        "--renderer-num-workers", type=int, default=1, help="worker threads per process"
    )
    serve.add_argument(
        "--workers", type=int, default=None, help="server processes (default: one per core)"
    )
    serve.add_argument("--api-key", default=os.environ.get("VLLM_API_KEY"))
    serve.add_argument(
        "--state-secret", default=None, help=f"stream_state HMAC secret (or ${STATE_SECRET_ENV})"
    )
    _bool_flag(serve, "--enable-request-id-headers", "echo X-Request-Id in responses")
    serve.add_argument("--max-logprobs", type=int, default=20)
    serve.add_argument("--max-body-bytes", type=int, default=64 * 1024 * 1024)
    serve.add_argument("--log-level", default="info")
    _add_limit_flags(serve)
    _media_flags(serve)
    return parser


# Hardening limits: (flag, type, help); the default is the Settings field's, so there is one source.
_LIMIT_FLAGS: tuple[tuple[str, type, str], ...] = (
    ("--max-stream-state-bytes", int, "longest stream_state accepted or issued, in characters"),
    ("--max-messages", int, "messages per chat request"),
    ("--max-tools", int, "tools per chat request"),
    ("--max-tool-schema-bytes", int, "total JSON bytes of a request's tool definitions"),
    ("--max-json-depth", int, "nesting depth of messages, tools and template kwargs"),
    ("--max-prompt-tokens", int, "prompt tokens per request (default: --max-model-len)"),
    ("--max-images", int, "images per request"),
    ("--request-timeout", float, "seconds a request may run before a clean 408 (0: no limit)"),
    ("--template-timeout", float, "seconds a per-request chat template may run"),
    ("--max-template-output-chars", int, "characters a per-request chat template may produce"),
    ("--template-memory-bytes", int, "address-space budget of the per-request template worker"),
)


def _add_limit_flags(parser: argparse.ArgumentParser) -> None:
    for flag, kind, help_text in _LIMIT_FLAGS:
        parser.add_argument(flag, type=kind, default=None, help=help_text)


def _limit_settings(args: argparse.Namespace) -> dict[str, Any]:
    """Only the limit flags given on the command line; the rest keep the Settings defaults."""
    values = {}
    for flag, _, _ in _LIMIT_FLAGS:
        name = flag.removeprefix("--").replace("-", "_")
        if getattr(args, name) is not None:
            values[name] = getattr(args, name)
    return values


def _media_flags(serve: argparse.ArgumentParser) -> None:
    serve.add_argument(
        "--limit-mm-per-prompt", type=_json_dict, default=None, help='e.g. {"image": 4}'
    )
    serve.add_argument("--mm-processor-kwargs", type=_json_dict, default=None)
    serve.add_argument("--media-io-kwargs", type=_json_dict, default=None)
    serve.add_argument(
        "--allowed-local-media-path", default=None, help="directory that file: image URLs may read"
    )
    serve.add_argument(
        "--media-num-workers",
        type=int,
        default=None,
        help="threads that decode and process images (default: one per core)",
    )
    serve.add_argument(
        "--media-executor",
        choices=["process", "thread"],
        default="thread",
        help="run image work in threads (default) or worker processes",
    )
    _bool_flag(
        serve,
        "--allow-private-media-urls",
        "fetch image URLs on loopback, private and link-local addresses",
    )
    serve.add_argument("--media-fetch-timeout", type=float, default=5.0, help="seconds")
    serve.add_argument("--max-media-bytes", type=int, default=20 * 1024 * 1024)
    serve.add_argument("--max-media-redirects", type=int, default=5)
    serve.add_argument("--max-image-pixels", type=int, default=64_000_000)
    serve.add_argument(
        "--mm-processor-cache-gb",
        type=float,
        default=0.0,
        help="GiB of processed images kept per process for reuse (default 0: off)",
    )


def _media_settings(args: argparse.Namespace) -> dict[str, Any]:
    return {
        "limit_mm_per_prompt": args.limit_mm_per_prompt,
        "mm_processor_kwargs": args.mm_processor_kwargs,
        "media_io_kwargs": args.media_io_kwargs,
        "allowed_local_media_path": args.allowed_local_media_path,
        "media_num_workers": args.media_num_workers or max(1, os.cpu_count() or 1),
        "media_executor": args.media_executor,
        "allow_private_media_urls": args.allow_private_media_urls,
        "media_fetch_timeout": args.media_fetch_timeout,
        "max_media_bytes": args.max_media_bytes,
        "max_media_redirects": args.max_media_redirects,
        "max_image_pixels": args.max_image_pixels,
        "mm_processor_cache_gb": args.mm_processor_cache_gb,
    }


def settings_from_args(args: argparse.Namespace, environ: dict[str, str] | None = None) -> Settings:
    env = os.environ if environ is None else environ
    if args.enable_auto_tool_choice and not args.tool_call_parser:
        raise SystemExit("--enable-auto-tool-choice requires --tool-call-parser")
    model = args.model
    if model is None:
        from render_service.model.default_model import ensure_default_model

        model = str(ensure_default_model())
    workers = args.workers if args.workers is not None else max(1, os.cpu_count() or 1)
    return Settings(
        model=model,
        served_model_name=args.served_model_name or (args.model if args.model else "default"),
        max_model_len=args.max_model_len,
        chat_template=args.chat_template,
        chat_template_content_format=args.chat_template_content_format,
        default_chat_template_kwargs=args.default_chat_template_kwargs,
        reasoning_effort_map=args.reasoning_effort_map,
        trust_request_chat_template=args.trust_request_chat_template,
        trust_request_mm_kwargs=args.trust_request_mm_kwargs,
        exclude_tools_when_tool_choice_none=args.exclude_tools_when_tool_choice_none,
        reasoning_parser=args.reasoning_parser,
        tool_call_parser=args.tool_call_parser,
        enable_auto_tool_choice=args.enable_auto_tool_choice,
        renderer_num_workers=args.renderer_num_workers,
        api_key=args.api_key,
        host=args.host,
        port=args.port,
        workers=workers,
        state_secret=args.state_secret or env.get(STATE_SECRET_ENV),
        enable_request_id_headers=args.enable_request_id_headers,
        max_logprobs=args.max_logprobs,
        max_body_bytes=args.max_body_bytes,
        **_limit_settings(args),
        **_media_settings(args),
    )


def parse_settings(argv: Sequence[str]) -> Settings:
    """Settings from a ``serve`` command line (without the leading ``serve``)."""
    args = build_parser().parse_args(["serve", *argv])
    return settings_from_args(args)


def main(argv: Sequence[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    settings = settings_from_args(args)
    from render_service.http.server import serve

    serve(settings, log_level=args.log_level)


if __name__ == "__main__":
    main(sys.argv[1:])
