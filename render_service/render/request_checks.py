"""Checks on chat and completion requests that vLLM makes before rendering (contract §3.5)."""

from __future__ import annotations

import secrets
from typing import Any

from render_service.errors import InvalidRequest, SchemaError, invalid_param
from render_service.model.parser_setup import named_tool
from render_service.protocol.chat import ChatCompletionRequest
from render_service.validation import stop_strings

_CACHE_SALT_FORBIDDEN = ("@", "/", "\\", "\0")
_CONTENT_OPTIONAL_ROLES = frozenset({"assistant"})


def base_request_id(header_id: str | None, body_id: str | None) -> str:
    """vLLM: the X-Request-Id header wins, then the body's request_id, else 16 random hex digits."""
    return header_id or body_id or secrets.token_hex(8)


def check_cache_salt(cache_salt: str | None) -> None:
    if cache_salt is None:
        return
    if len(cache_salt) > 128 or any(c in cache_salt for c in _CACHE_SALT_FORBIDDEN):
        raise invalid_param(
            "Parameter 'cache_salt' must be at most 128 characters and must not contain "
            "'@', '/', '\\\\', or NUL.",
            "cache_salt",
        )


def check_messages(messages: list[dict[str, Any]]) -> None:
    """The message-shape rules of vLLM's ChatCompletionMessageParam union."""
    for index, message in enumerate(messages):
        if not isinstance(message.get("role"), str):
            where = f"body.messages.{index}"
            raise SchemaError(
                f"1 validation error:\n  {{'loc': '{where}.role', 'msg': 'Field required'}}",
                f"{where}.role",
            )
        content = message.get("content")
        if content is None and message["role"] in _CONTENT_OPTIONAL_ROLES:
            continue
        if not isinstance(content, (str, list)):
            where = f"body.messages.{index}"
            raise SchemaError(
                f"1 validation error:\n  {{'loc': '{where}.content', 'msg': 'Input should be a valid string or a list of content parts'}}",
                f"{where}.content",
            )


def check_chat_request(request: ChatCompletionRequest) -> None:
    """The model validators of vLLM's ChatCompletionRequest, in its order."""
    check_messages(request.messages)
    if request.stream_options is not None and not request.stream:
        raise invalid_param(
            "Stream options can only be defined when `stream=True`.", "stream_options"
        )
    top = request.top_logprobs
    if top is not None and top != 0:
        if top < 0 and top != -1:
            raise invalid_param("`top_logprobs` must be a positive value or -1.", "top_logprobs")
        if not request.logprobs:
            raise invalid_param(
                "when using `top_logprobs`, `logprobs` must be set to true.", "top_logprobs"
            )
    if request.logprob_token_ids is not None and not request.logprobs:
        raise invalid_param(
            "`logprob_token_ids` requires `logprobs` to be true.", "logprob_token_ids"
        )
    if request.prompt_logprobs is not None and request.stream:
        raise invalid_param(
            "`prompt_logprobs` are not available when `stream=True`.", "prompt_logprobs"
        )
    if request.tools is not None and len(request.tools) == 0:
        raise invalid_param(
            "`tools` must not be an empty array. Either provide at least one tool or omit the field entirely.",
            "tools",
        )
    choice = request.tool_choice
    if isinstance(choice, (str, dict)) and choice != "none" and not request.tools:
        raise invalid_param("When using `tool_choice`, `tools` must be set.", "tool_choice")
    if isinstance(choice, str) and choice not in ("none", "auto", "required"):
        raise invalid_param(f"Invalid value for `tool_choice`: {choice!r}", "tool_choice")
    name = named_tool(choice) if isinstance(choice, dict) else None
    if name is not None:
        if request.structured_outputs:
            raise InvalidRequest(
                "Cannot use structured outputs together with a named `tool_choice`."
            )
        if not any(tool.function.name == name for tool in request.tools or []):
            raise invalid_param(
                "The tool specified in `tool_choice` does not match any of the specified `tools`",
                "tool_choice",
            )
    if request.continue_final_message and request.add_generation_prompt:
        raise InvalidRequest(
            "Cannot set both `continue_final_message` and `add_generation_prompt` to True."
        )
    stop_strings(request.stop)
    check_cache_salt(request.cache_salt)
    if request.seed is not None and not -(2**63) <= request.seed < 2**63:
        raise invalid_param("seed must fit in a signed 64-bit integer", "seed", request.seed)
