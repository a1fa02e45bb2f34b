"""What render must change in a request for the configured parsers (vLLM's `adjust_request`).

`RenderAdjustments` is what a family's hook returns; the builders below are shared by tool
families. vLLM 0.33 constrains tool calls with an xgrammar structural tag when the tool parser
has a structural-tag model (strict tool calling is on by default). The JSON text is compared byte
for byte with vLLM's, so it is built with `json.dumps` defaults, as vLLM serializes it.
"""

from __future__ import annotations

import json
from typing import Any

import msgspec

from parsers.request import ParseRequest

__all__ = [
    "RenderAdjustments",
    "TagSpelling",
    "constrained_functions",
    "json_call_format",
    "json_content",
    "tool_tags_format",
]

STRICT_LEVELS = ("auto", "function", "parameter")


class RenderAdjustments(msgspec.Struct, frozen=True, omit_defaults=True):
    """Changes to the rendered request's sampling params.

    `skip_special_tokens` None means "leave the request's value". A `structural_tag` goes to
    `sampling_params.structured_outputs.structural_tag` and replaces `response_format`.
    """

    skip_special_tokens: bool | None = None
    structural_tag: str | None = None
    #: A JSON schema for `structured_outputs.json` (vLLM's forced tool choice without a
    #: structural tag); like a tag it replaces `response_format`.
    json_schema: dict[str, Any] | None = None

    def merge(self, later: RenderAdjustments) -> RenderAdjustments:
        """These adjustments, then `later`'s (what it sets wins)."""
        return RenderAdjustments(
            skip_special_tokens=self.skip_special_tokens
            if later.skip_special_tokens is None
            else later.skip_special_tokens,
            structural_tag=self.structural_tag
            if later.structural_tag is None
            else later.structural_tag,
            json_schema=self.json_schema if later.json_schema is None else later.json_schema,
        )


class TagSpelling(msgspec.Struct, frozen=True):
    """How one call of a family opens and closes around its arguments."""

    begin: str  # may contain "{name}"
    end: str


def tool_tags_format(
    spellings: tuple[TagSpelling, ...],
    trigger: str,
    request: ParseRequest,
    strict_level: str,
) -> str | None:
    """Structural tag JSON for a request with tools, or None when vLLM adds none.

    Which functions and how strictly: see `constrained_functions`.
    """
    constrained = constrained_functions(request, strict_level)
    if constrained is None:
        return None
    functions, level = constrained
    choice = request.effective_tool_choice
    parallel = request.parallel_tool_calls is not False
    tags: list[dict[str, Any]] = []
    for function in functions:
        content = json_content(function, level)
        name = str(function.get("name", ""))
        for spelling in spellings:
            tags.append(
                {
                    "type": "tag",
                    "begin": spelling.begin.replace("{name}", name),
                    "content": content,
                    "end": spelling.end,
                }
            )
    fmt: dict[str, Any]
    if choice == "auto":
        fmt = {
            "type": "triggered_tags",
            "triggers": [trigger],
            "tags": tags,
            "at_least_one": False,
            "stop_after_first": not parallel,
            "excludes": [],
        }
    else:
        fmt = {
            "type": "tags_with_separator",
            "tags": tags,
            "separator": "",
            "at_least_one": True,
            "stop_after_first": choice == "named" or not parallel,
        }
    return json.dumps({"type": "structural_tag", "format": fmt})


def json_call_format(
    spelling: TagSpelling,
    trigger: str,
    excludes: list[str],
    request: ParseRequest,
    strict_level: str,
    style: str = "json",
) -> str | None:
    """Structural tag JSON in the shape of xgrammar's builtin `llama` template, or None.

    `style` is the argument syntax (`json`, or `qwen_xml` for `qwen_3_coder`). A named tool choice is the one tag itself; "auto" and "required" are triggered tags
    (at least one for "required"); `parallel_tool_calls=false` stops after the first.
    """
    constrained = constrained_functions(request, strict_level)
    if constrained is None:
        return None
    functions, level = constrained
    choice = request.effective_tool_choice
    tags = [
        {
            "type": "tag",
            "begin": spelling.begin.replace("{name}", str(function.get("name", ""))),
            "content": json_content(function, level, style),
            "end": spelling.end,
        }
        for function in functions
    ]
    if choice == "named":
        return json.dumps({"type": "structural_tag", "format": tags[0]}) if tags else None
    fmt = {
        "type": "triggered_tags",
        "triggers": [trigger],
        "tags": tags,
        "at_least_one": choice == "required",
        # Unverified against vLLM for "required": assumed to honour parallel_tool_calls too.
        "stop_after_first": request.parallel_tool_calls is False,
        "excludes": excludes,
    }
    return json.dumps({"type": "structural_tag", "format": fmt})


def constrained_functions(
    request: ParseRequest, strict_level: str
) -> tuple[list[dict[str, Any]], str] | None:
    """The functions a structural tag must cover and the resolved strict level, or None.

    Strictness: `auto` constrains nothing for tool_choice "auto" unless a tool is `strict`;
    `parallel_tool_calls=false` raises the level to `function` (the envelope only);
    `parameter`, or a `strict` tool, also pins the argument schema.
    """
    tools = request.tools or []
    choice = request.effective_tool_choice
    if not tools or choice == "none":
        return None
    level = strict_level
    if request.parallel_tool_calls is False and level == "auto":
        level = "function"
    functions = [_function(tool) for tool in tools]
    if choice == "auto" and level == "auto" and not any(f.get("strict") is True for f in functions):
        return None
    if choice == "named":
        functions = [f for f in functions if f.get("name") == request.named_tool]
    return functions, level


def json_content(function: dict[str, Any], level: str, style: str = "json") -> dict[str, Any]:
    return {
        "type": "json_schema",
        "json_schema": _schema(function, level),
        "style": style,
        "any_order": False,
        "max_whitespace_cnt": None,
        "excludes": [],
    }


def _function(tool: dict[str, Any]) -> dict[str, Any]:
    function = tool.get("function")
    return function if isinstance(function, dict) else {}


def _schema(function: dict[str, Any], level: str) -> Any:
    if level == "parameter" or function.get("strict") is True:
        parameters = function.get("parameters")
        # Unverified against vLLM: a pinned tool without parameters stays unconstrained.
        return parameters if parameters is not None else True
    return True
