"""Anthropic Messages -> chat request, as vLLM 0.33's ``/v1/messages/render`` converts it.

vLLM renders a Messages request by converting it to a chat completions request and rendering
that (``AnthropicServingMessages.to_chat_completion_request``); the functions here reproduce the
conversion and the request checks its pydantic model makes, with vLLM's error params.
"""

from __future__ import annotations

import json
import re
import time
from functools import cached_property
from typing import Any

import jinja2
import jinja2.ext
import jinja2.sandbox
import msgspec

from render_service.errors import InvalidRequest, RenderServiceError, SchemaError
from render_service.model import templating
from render_service.model.loading import Model
from render_service.protocol.chat import ChatCompletionRequest, ChatCompletionTool
from render_service.protocol.messages import (
    AnthropicMessage,
    AnthropicMessagesRequest,
    AnthropicTool,
    ContentBlock,
    ThinkingDisabled,
    ThinkingEnabled,
    ToolDefinition,
)
from render_service.protocol.sampling import StreamOptions
from render_service.settings import Settings

__all__ = [
    "TemplateProbes",
    "check_request",
    "disabled_thinking_effort",
    "merges_inline_system",
    "request_param",
    "to_chat_request",
]

# Claude Code's attribution header carries a per-request hash that would defeat prefix caching.
_BILLING_HEADER = "x-anthropic-billing-header"
_TOOL_CHANGES = ("tool_addition", "tool_removal")
_TOOL_CHOICES = {"auto": "auto", "any": "required", "none": "none"}
_EFFORTS = ("low", "medium", "high", "xhigh", "max")
_PROBE_MESSAGES = [{"role": "user", "content": "Hi"}]


def _value_error(message: str, param: str) -> SchemaError:
    """A pydantic model-validator failure in vLLM's shape."""
    return SchemaError(
        f"1 validation error:\n  {{'type': 'value_error', 'loc': '{param}', "
        f"'msg': 'Value error, {message}'}}",
        param,
    )


def check_request(request: AnthropicMessagesRequest) -> None:
    """The validators of vLLM's AnthropicMessagesRequest and its parts, with their params."""
    if not request.model:
        raise _value_error("Model is required", "body.model")
    if request.max_tokens <= 0:
        raise _value_error("max_tokens must be positive", "body.max_tokens")
    for index, message in enumerate(request.messages):
        _check_blocks(message.content, f"body.messages.{index}.content")
        if message.role != "system":
            _reject_tool_changes(message.content, f"body.messages.{index}")
    _check_blocks(request.system, "body.system")
    _reject_tool_changes(request.system, "body.system")
    choice = request.tool_choice
    if choice is not None and choice.type == "tool" and not choice.name:
        raise _value_error("tool_choice.name is required when type is 'tool'", "body.tool_choice")
    remote_decode = bool(
        request.kv_transfer_params and request.kv_transfer_params.get("do_remote_decode")
    )
    thinking = request.thinking
    if (
        not remote_decode
        and isinstance(thinking, ThinkingEnabled)
        and thinking.budget_tokens >= request.max_tokens
    ):
        raise _value_error("thinking.budget_tokens must be less than max_tokens", "body")


def _check_blocks(content: str | list[ContentBlock] | None, param: str) -> None:
    if content is None or isinstance(content, str):
        return
    for block in content:
        if block.type not in _TOOL_CHANGES:
            continue
        if block.tool is None:
            raise _value_error(f"tool is required for {block.type} blocks", param)
        if block.type == "tool_removal" and isinstance(block.tool, ToolDefinition):
            raise _value_error("tool_removal only accepts a tool_reference", param)


def _reject_tool_changes(content: str | list[ContentBlock] | None, param: str) -> None:
    if content is None or isinstance(content, str):
        return
    for block in content:
        if block.type in _TOOL_CHANGES:
            raise _value_error(
                f'{block.type} blocks are only allowed in messages with role "system"', param
            )


_UNION_FIELD = re.compile(r"^(body\.messages\.\d+\.content|body\.system)\.")


def request_param(param: str, data: bytes | str) -> str:
    """A schema error's param as pydantic reports it for a Messages body.

    An error inside a ``str | list[block]`` field is reported at the field (the string branch
    fails first); one inside ``thinking`` names its ``type`` tag (a discriminated union).
    """
    union = _UNION_FIELD.match(param)
    if union:
        return union.group(1)
    if param.startswith("body.thinking."):
        try:
            kind = msgspec.json.decode(data).get("thinking", {}).get("type")
        except (msgspec.DecodeError, AttributeError):
            kind = None
        if isinstance(kind, str) and param != f"body.thinking.{kind}":
            return f"body.thinking.{kind}." + param.removeprefix("body.thinking.")
    return param


def merges_inline_system(template: str | None) -> bool:
    """Whether a template needs system messages first, so inline ones are merged into the first.

    vLLM decides by rendering [system, user, system, user] in a bare sandbox: a template that
    fails (e.g. raises on a late system message) gets them merged.
    """
    if not template:
        return True
    env = jinja2.sandbox.ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols]
    )
    conversation = [{"role": role, "content": "t"} for role in ("system", "user") * 2]
    try:
        env.from_string(template).render(messages=conversation, add_generation_prompt=False)
    except jinja2.TemplateError:
        return True
    return False


class TemplateProbes:
    """What vLLM learns about the chat template once per server, for Messages requests."""

    def __init__(self, model: Model, settings: Settings) -> None:
        self._model = model
        self._settings = settings

    @cached_property
    def merge_inline_system(self) -> bool:
        """Whether inline system messages join the first one (``merges_inline_system``)."""
        return merges_inline_system(self._model.info.chat_template)

    @cached_property
    def disabled_thinking_effort(self) -> str:
        """The effort ``thinking: {type: disabled}`` becomes (``disabled_thinking_effort``)."""
        return disabled_thinking_effort(self._model, self._settings)


def disabled_thinking_effort(model: Model, settings: Settings) -> str:
    """The ``reasoning_effort`` that ``thinking: {type: disabled}`` becomes for this model.

    vLLM probes the template once per server: "none", unless rendering with it fails or gives
    the same prompt as some real effort (a template that ignores efforts); then "low". Harmony
    (gpt-oss, no template) refuses "none", so it is "low" there.
    """
    if model.harmony is not None:
        return "low"
    none_prompt = _probe(model, settings, "none")
    if none_prompt is None:
        return "low"
    if any(_probe(model, settings, effort) == none_prompt for effort in _EFFORTS):
        return "low"
    return "none"


def _probe(model: Model, settings: Settings, effort: str) -> str | None:
    """The prompt text of a one-message chat with ``effort`` (equal text, equal ids)."""
    template = model.info.chat_template
    if template is None:
        return None
    request = ChatCompletionRequest(messages=_PROBE_MESSAGES, reasoning_effort=effort)  # type: ignore[arg-type]
    try:
        kwargs = templating.template_kwargs(request, settings)
        conversation = templating.build_conversation(
            request.messages,
            templating.detect_content_format(template),
            templating.supports_developer_role(template),
        )
        return templating.apply_template(
            model.special_tokens_map, template, conversation, None, kwargs
        )
    except RenderServiceError:
        return None


def to_chat_request(
    request: AnthropicMessagesRequest,
    *,
    merge_inline_system: bool,
    disabled_thinking_effort: str,
) -> ChatCompletionRequest:
    """The chat request vLLM renders for a Messages request (``check_request`` it first)."""
    messages: list[dict[str, Any]] = []
    _system_message(request, messages, merge_inline_system)
    for message in request.messages:
        _convert_message(message, messages, merge_inline_system)
    chat = ChatCompletionRequest(
        model=request.model,
        messages=messages,
        max_tokens=request.max_tokens,
        max_completion_tokens=request.max_tokens,
        stop=request.stop_sequences,
        temperature=request.temperature,
        top_p=request.top_p,
        top_k=request.top_k,
        watermarking=request.watermarking,
        cache_salt=request.cache_salt,
        kv_transfer_params=request.kv_transfer_params,
        ec_transfer_params=request.ec_transfer_params,
        vllm_xargs=request.vllm_xargs,
        chat_template_kwargs=request.chat_template_kwargs,
        mm_payload=_mm_payload(request),
        tool_choice=None,
    )
    if request.stream:
        chat.stream = True
        chat.stream_options = StreamOptions(include_usage=True, continuous_usage_stats=True)
    output = request.output_config
    if output is not None and output.format is not None and output.format.schema:
        chat.response_format = {
            "type": output.format.type,
            "json_schema": {"name": output.format.type, "schema": output.format.schema},
        }
    if output is not None and output.effort is not None:
        chat.reasoning_effort = output.effort
    # "adaptive" pins nothing; "disabled" maps to the effort the server resolved for it.
    thinking = request.thinking
    if isinstance(thinking, ThinkingDisabled):
        chat.reasoning_effort = disabled_thinking_effort  # type: ignore[assignment]
    elif isinstance(thinking, ThinkingEnabled):
        chat.thinking_token_budget = thinking.budget_tokens
    choice = request.tool_choice
    if choice is not None:
        chat.parallel_tool_calls = not choice.disable_parallel_tool_use
        if choice.type == "tool":
            chat.tool_choice = {"type": "function", "function": {"name": choice.name}}
        else:
            chat.tool_choice = _TOOL_CHOICES[choice.type]
    tools = _resolve_tools(request)
    if tools is not None:
        if chat.tool_choice is None:
            chat.tool_choice = "auto"
        chat.tools = [_chat_tool(tool) for tool in tools]
    return chat


def _mm_payload(request: AnthropicMessagesRequest) -> Any:
    if request.return_mm_kwargs is False and request.mm_payload == "tensors":
        return "none"
    return request.mm_payload


def _system_text(content: str | list[ContentBlock]) -> str | None:
    if isinstance(content, str):
        return None if content.startswith(_BILLING_HEADER) else content
    parts = [
        block.text
        for block in content
        if block.type == "text" and block.text and not block.text.startswith(_BILLING_HEADER)
    ]
    return "".join(parts) if parts else None


def _system_message(
    request: AnthropicMessagesRequest, messages: list[dict[str, Any]], merge_inline: bool
) -> None:
    parts: list[str] = []
    system = request.system
    if isinstance(system, str) and system:
        parts.append(system)
    elif isinstance(system, list):
        parts.extend(
            block.text
            for block in system
            if block.type == "text" and block.text and not block.text.startswith(_BILLING_HEADER)
        )
    if merge_inline:
        for message in request.messages:
            if message.role == "system" and (text := _system_text(message.content)):
                parts.append(text)
    if parts:
        messages.append({"role": "system", "content": "".join(parts)})


def _convert_message(
    message: AnthropicMessage, messages: list[dict[str, Any]], merge_inline: bool
) -> None:
    if message.role == "system":
        text = None if merge_inline else _system_text(message.content)
        if text:
            messages.append({"role": "system", "content": text})
        return
    out: dict[str, Any] = {"role": message.role}
    if isinstance(message.content, str):
        out["content"] = message.content
    else:
        _convert_blocks(message.role, message.content, out, messages)
    # A user turn made only of tool results has become tool messages: nothing is left of it.
    if not (message.role == "user" and "content" not in out):
        messages.append(out)


def _convert_blocks(
    role: str, blocks: list[ContentBlock], out: dict[str, Any], messages: list[dict[str, Any]]
) -> None:
    parts: list[dict[str, Any]] = []
    calls: list[dict[str, Any]] = []
    reasoning: list[str] = []
    for block in blocks:
        kind = block.type
        if kind == "text" and block.text:
            parts.append({"type": "text", "text": block.text})
        elif kind == "image" and block.source:
            parts.append({"type": "image_url", "image_url": {"url": _image_url(block.source)}})
        elif kind == "thinking" and block.thinking is not None:
            reasoning.append(block.thinking)
        elif kind == "tool_use":
            calls.append(
                {
                    # vLLM's fallback id changes every second; no template here writes ids.
                    "id": block.id or f"call_{int(time.time())}",
                    "type": "function",
                    "function": {
                        "name": block.name or "",
                        # Python's json.dumps spelling, as vLLM writes the history arguments.
                        "arguments": json.dumps(block.input or {}),
                    },
                }
            )
        elif kind == "tool_result":
            if role == "user":
                _user_tool_result(block, messages)
            else:
                result = str(block.content) if block.content else ""
                parts.append({"type": "text", "text": f"Tool result: {result}"})
    if reasoning:
        out["reasoning"] = "".join(reasoning)
    if calls:
        out["tool_calls"] = calls
    if parts:
        if len(parts) == 1 and parts[0]["type"] == "text":
            out["content"] = parts[0]["text"]
        else:
            out["content"] = parts


def _image_url(source: dict[str, Any]) -> str:
    if source.get("type") == "url":
        return str(source.get("url", ""))
    return f"data:{source.get('media_type', 'image/jpeg')};base64,{source.get('data', '')}"


def _user_tool_result(block: ContentBlock, messages: list[dict[str, Any]]) -> None:
    """A user turn's tool_result becomes a tool message (plus a user turn for its images)."""
    text = ""
    images: list[str] = []
    references: list[dict[str, Any]] = []
    if isinstance(block.content, str):
        text = block.content
    elif isinstance(block.content, list):
        texts = []
        for item in block.content:
            kind = item.get("type")
            if kind == "text":
                texts.append(item.get("text", ""))
            elif kind == "image":
                images.append(_image_url(item.get("source", {})))
            elif kind == "tool_reference":
                name = item.get("tool_name") or item.get("name")
                if name:
                    references.append({"type": "tool_reference", "name": name})
        text = "\n".join(str(t) for t in texts)
    call_id = block.tool_use_id or ""
    messages.append({"role": "tool", "tool_call_id": call_id, "content": text or ""})
    if images:
        messages.append(
            {
                "role": "user",
                "content": [{"type": "image_url", "image_url": {"url": u}} for u in images],
            }
        )
    if references:
        messages.append({"role": "tool", "tool_call_id": call_id, "content": references})


def _resolve_tools(request: AnthropicMessagesRequest) -> list[AnthropicTool] | None:
    """The tools in effect at the end of the conversation, after tool_addition/removal blocks."""
    changes = [
        block
        for message in request.messages
        if not isinstance(message.content, str)
        for block in message.content
        if block.type in _TOOL_CHANGES
    ]
    if not changes:
        return request.tools
    tools = {tool.name: tool for tool in request.tools or []}
    removed: set[str] = set()
    for block in changes:
        change = block.tool
        if isinstance(change, ToolDefinition):
            name = change.definition.name
            tools[name] = change.definition
        elif change is not None:
            name = change.name
            if name not in tools:
                raise InvalidRequest(
                    f"{block.type} references tool {name!r}, which is not declared in tools"
                )
            if block.type == "tool_addition":
                tool = tools[name]
                tools[name] = AnthropicTool(
                    name=tool.name,
                    input_schema=tool.input_schema,
                    description=tool.description,
                    strict=tool.strict,
                )
        else:
            continue
        if block.type == "tool_removal":
            removed.add(name)
        else:
            removed.discard(name)
    return [tool for name, tool in tools.items() if name not in removed]


def _chat_tool(tool: AnthropicTool) -> ChatCompletionTool:
    schema = tool.input_schema
    if "type" not in schema:
        schema = {**schema, "type": "object"}
    function: dict[str, Any] = {
        "name": tool.name,
        "description": tool.description,
        "parameters": schema,
    }
    if tool.strict is not None:
        function["strict"] = tool.strict
    return msgspec.convert({"type": "function", "function": function}, ChatCompletionTool)
