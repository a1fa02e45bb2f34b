"""OpenAI Responses -> chat messages and tools, as vLLM 0.33's ``/v1/responses/render`` builds them.

vLLM validates a Responses request against the OpenAI SDK's unions, then builds chat messages
from ``instructions`` and ``input`` (``construct_input_messages``) and function tools for the
template (``construct_tool_dicts``). The checks here raise what vLLM answers: a schema error with
param ``body.input`` / ``body.tools`` for a malformed item or tool, vLLM's own messages otherwise.
"""

from __future__ import annotations

import json
from typing import Any

import msgspec

from render_service.errors import SchemaError, StatelessRefusal, invalid_param
from render_service.model import templating
from render_service.protocol.chat import ChatCompletionRequest, ChatCompletionTool
from render_service.protocol.responses import ResponsesRequest
from render_service.settings import Settings

__all__ = [
    "chat_tool_choice",
    "check_request",
    "check_text_format",
    "input_messages",
    "parse_chat_request",
    "refuse_previous_response",
    "request_param",
    "template_kwargs",
    "template_tools",
]

# vLLM shows a custom (free-form) tool to the model as a one-string-argument function.
_CUSTOM_TOOL_PARAMETERS = {
    "type": "object",
    "properties": {
        "input": {"type": "string", "description": "The freeform text payload for this tool."}
    },
    "required": ["input"],
    "additionalProperties": False,
}
_NAMESPACE_SEPARATOR = "__"
_ROLES = ("user", "assistant", "system", "developer")
_INPUT_PARTS = ("input_text", "input_image", "input_file")
_TOOL_TYPES = frozenset(
    {
        "function",
        "custom",
        "namespace",
        "file_search",
        "web_search",
        "web_search_preview",
        "web_search_preview_2025_03_11",
        "web_search_2025_08_26",
        "computer_use_preview",
        "computer",
        "mcp",
        "code_interpreter",
        "image_generation",
        "local_shell",
        "shell",
        "apply_patch",
    }
)


def _bad(param: str, message: str) -> SchemaError:
    return SchemaError(f"1 validation error:\n  {{'loc': '{param}', 'msg': '{message}'}}", param)


def check_request(request: ResponsesRequest) -> str | dict[str, Any]:
    """vLLM's before-validators of ResponsesRequest, in the order it runs them.

    Returns the tool choice vLLM keeps: "none" for "auto" without tools, a named choice
    resolved to its flat ``<namespace>__<name>`` when given by its local name.
    """
    choice = _check_tool_usage(request)
    for index, tool in enumerate(request.tools):
        _check_tool(tool, f"body.tools.{index}")
    if isinstance(request.input, list):
        for item in request.input:
            _check_item(item)
    if request.prompt is not None:
        raise invalid_param("prompt template is not supported", "prompt")
    if request.background and not (request.store if request.store is not None else True):
        raise invalid_param("background can only be used when `store` is true", "background")
    if request.cache_salt is not None and (
        len(request.cache_salt) > 128 or any(c in request.cache_salt for c in "@/\\\0")
    ):
        raise invalid_param(
            "Parameter 'cache_salt' must be at most 128 characters and must not contain "
            "'@', '/', '\\\\', or NUL.",
            "cache_salt",
        )
    return choice


def _check_tool_usage(request: ResponsesRequest) -> str | dict[str, Any]:
    choice = request.tool_choice
    named = isinstance(choice, dict) and choice.get("type") in ("function", "custom")
    if not request.tools:
        if choice in ("auto", "none"):
            return "none"
        if choice == "required":
            raise invalid_param(
                "Tool choice 'required' must be specified with 'tools' parameter.", "tool_choice"
            )
        if named:
            raise invalid_param(
                "Tool choice 'function' not found in 'tools' parameter.", "tool_choice"
            )
    elif named and isinstance(choice, dict):
        name = choice.get("name")
        if not name or not isinstance(name, str):
            raise invalid_param(
                "Tool choice 'function' not found in 'tools' parameter.", "tool_choice"
            )
        resolved = _resolve_named_choice(name, request.tools)
        if resolved != name:
            return {**choice, "name": resolved}
    if isinstance(choice, str) and choice not in ("auto", "none", "required"):
        raise _bad("body.tool_choice", "Input should be 'none', 'auto' or 'required'")
    if isinstance(choice, dict) and not isinstance(choice.get("type"), str):
        raise _bad("body.tool_choice", "Input should be a valid tool choice")
    return choice


def _resolve_named_choice(name: str, tools: list[dict[str, Any]]) -> str:
    exact: set[str] = set()
    local: dict[str, list[str]] = {}
    for tool in tools:
        if tool.get("type") == "namespace":
            namespace, members = tool.get("name"), tool.get("tools")
            if not isinstance(members, list) or not isinstance(namespace, str):
                return name
            for member in members:
                member_name = member.get("name") if isinstance(member, dict) else None
                if isinstance(member_name, str):
                    flat = f"{namespace}{_NAMESPACE_SEPARATOR}{member_name}"
                    exact.add(flat)
                    local.setdefault(member_name, []).append(flat)
        elif isinstance(tool.get("name"), str):
            exact.add(tool["name"])
    if name in exact:
        return name
    candidates = local.get(name, [])
    if len(candidates) == 1:
        return candidates[0]
    if candidates:
        raise invalid_param(
            f"Tool choice '{name}' is ambiguous: it is defined in more than one namespace "
            f"({', '.join(candidates)}). Select it by its full '<namespace>__<name>' name.",
            "tool_choice",
        )
    raise invalid_param("Tool choice 'function' not found in 'tools' parameter.", "tool_choice")


def _check_tool(tool: Any, param: str) -> None:
    if not isinstance(tool, dict) or tool.get("type") not in _TOOL_TYPES:
        raise _bad(param, "Input should be a valid tool")
    kind = tool["type"]
    if kind in ("function", "custom", "namespace") and not isinstance(tool.get("name"), str):
        raise _bad(f"{param}.name", "Field required")
    if kind == "function" and not isinstance(tool.get("parameters", {}), dict | None):
        raise _bad(f"{param}.parameters", "Input should be a valid dictionary")
    if kind == "namespace":
        members = tool.get("tools")
        if not isinstance(members, list):
            raise _bad(f"{param}.tools", "Field required")
        for index, member in enumerate(members):
            _check_tool(member, f"{param}.tools.{index}")
    if kind == "custom":
        fmt = tool.get("format")
        if isinstance(fmt, dict) and fmt.get("type") == "grammar":
            raise invalid_param(
                "Custom tools with a grammar format are not supported; only free-form text "
                "custom tools are accepted.",
                "tools",
            )


def _is_str(item: dict[str, Any], key: str) -> bool:
    return isinstance(item.get(key), str)


def _check_item(item: Any) -> None:
    """One ``input`` item against the shapes vLLM accepts (any failure: body.input)."""
    if not isinstance(item, dict):
        raise _bad("body.input", "Input should be a valid input item")
    kind = item.get("type")
    ok = True
    if kind == "function_call":
        ok = all(_is_str(item, k) for k in ("arguments", "call_id", "name"))
    elif kind == "custom_tool_call":
        ok = _is_str(item, "call_id") and _is_str(item, "name") and _is_str(item, "input")
    elif kind == "reasoning":
        ok = isinstance(item.get("summary"), list) and all(
            isinstance(s, dict) and _is_str(s, "text") for s in item["summary"]
        )
        content = item.get("content")
        ok = ok and (
            content is None
            or (
                isinstance(content, list)
                and all(isinstance(c, dict) and _is_str(c, "text") for c in content)
            )
        )
    elif kind in ("function_call_output", "custom_tool_call_output"):
        output = item.get("output")
        ok = isinstance(output, str) or (isinstance(output, list) and _parts_ok(output))
        ok = ok and (item.get("call_id") is None or _is_str(item, "call_id"))
    elif kind == "item_reference":
        ok = _is_str(item, "id")
    elif kind in (None, "message"):
        ok = _message_ok(item)
    else:
        ok = False
    if not ok:
        raise _bad("body.input", "Input should be a valid input item")


def _message_ok(item: dict[str, Any]) -> bool:
    role, content = item.get("role"), item.get("content")
    if role not in _ROLES:
        return False
    if isinstance(content, str):
        return True
    if not isinstance(content, list):
        return False
    if role == "assistant" and item.get("type") == "message":
        return bool(content) and all(
            isinstance(p, dict) and p.get("type") == "output_text" and _is_str(p, "text")
            for p in content
        )
    return _parts_ok(content)


def _parts_ok(parts: list[Any]) -> bool:
    for part in parts:
        if not isinstance(part, dict) or part.get("type") not in _INPUT_PARTS:
            return False
        if part["type"] == "input_text" and not _is_str(part, "text"):
            return False
    return True


def input_messages(request: ResponsesRequest) -> list[dict[str, Any]]:
    """The chat messages vLLM renders for ``instructions`` and ``input`` (checked first)."""
    messages: list[dict[str, Any]] = []
    if request.instructions:
        messages.append({"role": "system", "content": request.instructions})
    if isinstance(request.input, str):
        messages.append({"role": "user", "content": request.input})
        return messages
    converted: list[dict[str, Any]] = []
    for item in request.input:
        message = _message_for(item, converted[-1] if converted else None)
        if message is not None:
            converted.append(message)
    return messages + converted


def _message_for(item: dict[str, Any], previous: dict[str, Any] | None) -> dict[str, Any] | None:
    """A new chat message for ``item``, or None when it was merged into ``previous``."""
    assistant = previous if previous is not None and previous.get("role") == "assistant" else None
    kind = item.get("type")
    if kind in ("function_call", "custom_tool_call"):
        name = item["name"]
        if kind == "function_call":
            arguments = item["arguments"]
            if item.get("namespace"):
                name = f"{item['namespace']}{_NAMESPACE_SEPARATOR}{name}"
        else:
            arguments = json.dumps({"input": item.get("input") or ""}, ensure_ascii=False)
        call = {
            "id": item["call_id"],
            "function": {"name": name, "arguments": arguments},
            "type": "function",
        }
        if assistant is not None:
            assistant.setdefault("tool_calls", []).append(call)
            return None
        return {"role": "assistant", "tool_calls": [call]}
    if kind == "reasoning":
        if item.get("encrypted_content"):
            raise invalid_param("Encrypted content is not supported.", "input")
        content, summary = item.get("content"), item["summary"]
        reasoning = content[0]["text"] if content else summary[0]["text"] if summary else ""
        if assistant is not None and assistant.get("reasoning") is None:
            assistant["reasoning"] = reasoning
            return None
        return {"role": "assistant", "reasoning": reasoning}
    if kind in ("function_call_output", "custom_tool_call_output"):
        return {"role": "tool", "content": item.get("output"), "tool_call_id": item.get("call_id")}
    if kind == "item_reference":
        raise invalid_param("Unsupported input item type: item_reference", "input")
    if item.get("role") == "assistant":
        content = item.get("content")
        text = content if isinstance(content, str) else content[0].get("text") if content else None
        if text is not None:
            if assistant is not None and assistant.get("content") is None:
                assistant["content"] = text
                return None
            return {"role": "assistant", "content": text}
    message = dict(item)
    if isinstance(message.get("content"), list):
        # vLLM fills in the API default before validating an input image part.
        message["content"] = [
            {**part, "detail": "auto"}
            if isinstance(part, dict) and part.get("type") == "input_image" and "detail" not in part
            else part
            for part in message["content"]
        ]
    return message


def template_tools(
    request: ResponsesRequest, exclude_when_none: bool
) -> list[dict[str, Any]] | None:
    """Function tools as the chat template sees them (namespaces flattened, custom tools shimmed)."""
    if not request.tools or (request.tool_choice == "none" and exclude_when_none):
        return None
    out: list[dict[str, Any]] = []
    for tool in request.tools:
        kind = tool["type"]
        if kind == "function":
            out.append(_chat_tool(tool["name"], tool))
        elif kind == "custom":
            out.append(
                _chat_tool(
                    tool["name"],
                    {"description": tool.get("description"), "parameters": _CUSTOM_TOOL_PARAMETERS},
                )
            )
        elif kind == "namespace":
            out.extend(
                _chat_tool(f"{tool['name']}{_NAMESPACE_SEPARATOR}{member['name']}", member)
                for member in tool["tools"]
                if member.get("type") == "function"
            )
    return out


def _chat_tool(name: str, tool: dict[str, Any]) -> dict[str, Any]:
    function = {
        "name": name,
        "description": tool.get("description"),
        "parameters": tool.get("parameters"),
    }
    if tool.get("strict") is not None:
        function["strict"] = tool["strict"]
    return {"type": "function", "function": function}


def check_text_format(request: ResponsesRequest) -> dict[str, Any] | None:
    """``structured_outputs`` for the sampling params: from ``text.format`` or as given."""
    fmt = request.text.format if request.text is not None else None
    if fmt is None:
        return request.structured_outputs
    if request.structured_outputs is not None:
        raise invalid_param(
            "Cannot specify both structured_outputs and text.format", "structured_outputs"
        )
    if fmt.type == "json_object":
        return {"json_object": True}
    if fmt.type == "json_schema" and fmt.schema is not None:
        return {"json": fmt.schema}
    return None


def refuse_previous_response(request: ResponsesRequest) -> None:
    """The render endpoint is stateless: it cannot look up an earlier response."""
    if request.previous_response_id is not None:
        raise StatelessRefusal(
            "previous_response_id is not supported by the stateless render endpoint.",
            "previous_response_id",
        )


def request_param(param: str, data: bytes | str) -> str:
    """pydantic reports an error inside ``input`` (``str`` or items) at ``body.input``."""
    if param.startswith("body.input."):
        return "body.input"
    return param


def template_kwargs(request: ResponsesRequest, settings: Settings) -> dict[str, Any]:
    """vLLM's ResponsesRequest.build_chat_params kwargs over the server's defaults."""
    user = dict(request.chat_template_kwargs or {})
    if "chat_template" in user and not settings.trust_request_chat_template:
        raise templating.untrusted_template()
    effort: str | None = request.reasoning.effort if request.reasoning is not None else None
    effort_map = settings.reasoning_effort_map or {}
    if effort is not None and effort in effort_map:
        effort = effort_map[effort]
    continue_final = _continues_final_item(request)
    merged: dict[str, Any] = {
        **templating.VLLM_DEFAULT_TEMPLATE_KWARGS,
        **(settings.default_chat_template_kwargs or {}),
        **user,
        "add_generation_prompt": not continue_final,
        "continue_final_message": continue_final,
    }
    if effort is not None:
        merged["reasoning_effort"] = effort
        if "enable_thinking" not in user:
            merged["enable_thinking"] = effort != "none"
    return merged


def _continues_final_item(request: ResponsesRequest) -> bool:
    """A last assistant message or reasoning item still in progress is continued, not closed."""
    if isinstance(request.input, str) or not request.input:
        return False
    last = request.input[-1]
    if last.get("type", "message") not in ("message", "reasoning"):
        return False
    return last.get("status") in ("in_progress", "incomplete")


def chat_tool_choice(request: ResponsesRequest) -> str | dict[str, Any]:
    """The tool choice in chat's terms: a named function choice, or "auto" for hosted kinds."""
    choice = request.tool_choice
    if not request.tools:
        return "none"
    if isinstance(choice, dict):
        if choice.get("type") in ("function", "custom"):
            return {"type": "function", "function": {"name": choice.get("name")}}
        return "auto"
    return choice


def parse_chat_request(request: ResponsesRequest) -> ChatCompletionRequest:
    """A chat request whose derender options (tools, choice, reasoning, stops) equal the Responses one."""
    tools = template_tools(request, False)
    return ChatCompletionRequest(
        messages=[],
        tools=msgspec.convert(tools, list[ChatCompletionTool]) if tools else None,
        tool_choice=chat_tool_choice(request),
        parallel_tool_calls=request.parallel_tool_calls,
        include_reasoning=request.include_reasoning,
        skip_special_tokens=request.skip_special_tokens,
        stop=request.stop,
        stop_token_ids=request.stop_token_ids,
        include_stop_str_in_output=request.include_stop_str_in_output,
        chat_template_kwargs=request.chat_template_kwargs,
        reasoning_effort=request.reasoning.effort if request.reasoning is not None else None,
    )
