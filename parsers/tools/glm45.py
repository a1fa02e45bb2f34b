"""GLM-4.5 / GLM-4.6 reasoning and tool calls (vLLM names `glm45` for both; also `glm47`).

Format (chat template: https://huggingface.co/zai-org/GLM-4.5-Air/blob/main/chat_template.jinja)::

    \\n<think>REASONING</think>\\nCONTENT
    <tool_call>NAME
    <arg_key>KEY</arg_key>
    <arg_value>VALUE</arg_value>
    </tool_call>

All eight tags are added tokens; `<think>`, `</think>`, `<tool_call>` and `</tool_call>` are
matched by id, the argument tags by their text (vLLM's engine does the same). With thinking on
the output starts in reasoning (`<think>` optional); `enable_thinking: false` (or `thinking:
false`) turns reasoning off and `<think>` blocks stay content. A `<tool_call>` inside reasoning
ends it. The name runs to the first `<arg_key>` (whitespace around it dropped), values are
typed by the tool's schema (`parsers.schema_values`), a call of a function that is not in `tools` is
dropped with its markup. `<|system|>`, `<|user|>`, `<|assistant|>` and `<|observation|>` bound
the prompt look-back; other special tokens in the output are dropped.
"""

from __future__ import annotations

import json
from typing import Any, ClassVar

from parsers._lexer import Lexicon
from parsers._tag_engine import (
    ARG_CLOSE,
    ARG_OPEN,
    ARG_TEXT,
    ARGS,
    CLOSE_CALL,
    CONTENT,
    END_REASONING,
    IGNORE,
    K_ARG_TAG,
    K_ARGS_OPEN,
    K_TEXT,
    K_THINK_END,
    K_THINK_START,
    K_TOOL_END,
    K_TOOL_START,
    MAX_HELD,
    NAME,
    NAME_DONE_ARGS,
    OPEN_CALL,
    REASONING,
    START_REASONING,
    ArgScan,
    EngineSpec,
    marker_kinds,
)
from parsers.engine_family import EngineFamily
from parsers.facts import TokenizerFacts

__all__ = ["Glm45", "build_reasoning", "build_tool", "scan_args", "structural_tag"]

_KEY_OPEN, _KEY_CLOSE = "<arg_key>", "</arg_key>"
_VALUE_OPEN, _VALUE_CLOSE = "<arg_value>", "</arg_value>"
_BOUNDARIES = ("<|system|>", "<|user|>", "<|assistant|>", "<|observation|>")

_TABLE = {
    (REASONING, K_THINK_START): IGNORE,
    (REASONING, K_THINK_END): END_REASONING,
    (REASONING, K_TOOL_START): OPEN_CALL,
    (CONTENT, K_THINK_START): START_REASONING,
    (CONTENT, K_THINK_END): IGNORE,
    (CONTENT, K_TOOL_START): OPEN_CALL,
    (NAME, K_ARGS_OPEN): NAME_DONE_ARGS,
    (NAME, K_TOOL_END): CLOSE_CALL,
    (ARGS, K_TOOL_END): CLOSE_CALL,
}

# Argument scanner modes.
_BETWEEN, _KEY, _AFTER_KEY, _VALUE = 0, 1, 2, 3


def scan_args(state: ArgScan, text: str, final: bool) -> tuple[ArgScan, list[tuple[int, str]]]:
    """Read argument text; tags always arrive as whole pieces (the engine lexes them).

    `<arg_key>K</arg_key>` then optional whitespace then `<arg_value>V</arg_value>`; inside
    a key or a value every other tag is text (a value missing its `</arg_value>` runs on, as
    vLLM streams it); anything else between pairs is ignored.
    """
    mode, key = state.mode, state.buf
    ops: list[tuple[int, str]] = []
    if mode == _VALUE:
        if text == _VALUE_CLOSE:
            return ArgScan(_BETWEEN), [(ARG_CLOSE, "")]
        return state, [(ARG_TEXT, text)] if text else []
    if mode == _KEY:
        if text == _KEY_CLOSE:
            return ArgScan(_AFTER_KEY, key.strip()), ops
        key += text
        # A key longer than MAX_HELD is not read (the state stays bounded): the pair is skipped.
        return (ArgScan(_KEY, key) if len(key) <= MAX_HELD else ArgScan(_BETWEEN)), ops
    if mode == _AFTER_KEY:
        if text == _VALUE_OPEN:
            return ArgScan(_VALUE), [(ARG_OPEN, key)]
        if not text.strip():
            return state, ops
    if text == _KEY_OPEN:
        return ArgScan(_KEY), ops
    return ArgScan(_BETWEEN), ops


def _spec(facts: TokenizerFacts) -> EngineSpec:
    family = "glm45"
    ids = {
        K_THINK_START: facts.marker_id("<think>", family),
        K_THINK_END: facts.marker_id("</think>", family),
        K_TOOL_START: facts.marker_id("<tool_call>", family),
        K_TOOL_END: facts.marker_id("</tool_call>", family),
    }
    markers = marker_kinds(facts, ids)
    literals = {spelling: K_TEXT for _, spelling in markers.values()}
    literals.update({_KEY_OPEN: K_ARGS_OPEN, _KEY_CLOSE: K_ARG_TAG})
    literals.update({_VALUE_OPEN: K_ARG_TAG, _VALUE_CLOSE: K_ARG_TAG})
    boundaries = (facts.optional_id(t) for t in _BOUNDARIES)
    return EngineSpec(
        family=family,
        lexicon=Lexicon(literals),
        markers=markers,
        table=_TABLE,
        args=scan_args,
        spellings={token_id: spelling for token_id, (_, spelling) in markers.items()},
        think_start_id=ids[K_THINK_START],
        think_end_id=ids[K_THINK_END],
        end_ids=frozenset((ids[K_THINK_END], ids[K_TOOL_START])),
        boundary_ids=frozenset(b for b in boundaries if b is not None),
        strip_name=True,
        args_value_mode=_VALUE,
    )


#: Everything a value may not contain (vLLM's `_GLM_4_7_VALUE_EXCLUDES`).
_EXCLUDES = ["<think>", "</think>", "<tool_call>", "</tool_call>", _KEY_OPEN, _KEY_CLOSE,
             _VALUE_OPEN, _VALUE_CLOSE]  # fmt: skip
_SCHEMA_KEYS = ("$ref", "allOf", "anyOf", "oneOf", "patternProperties")


def structural_tag(functions: list[dict[str, Any]], choice: str) -> dict[str, Any]:
    """vLLM's `glm_4_7` structural tag format for these tools and choice.

    All tools strict: xgrammar's builtin GLM template (the schema in `glm_xml` style). Else a
    tag per tool: a strict tool pins its schema; another one pins its keys and simple value
    types, one `<arg_key>K</arg_key><arg_value>V</arg_value>` pair at a time.
    """
    if all(f.get("strict") for f in functions):
        tags = [_strict_tag(f) for f in functions]
        if choice == "forced":
            return tags[0]
        return _triggered(tags, at_least_one=choice == "required")
    tags = [_strict_tag(f) if f.get("strict") else _shallow_tag(f) for f in functions]
    if choice == "auto":
        return _triggered(tags, at_least_one=False)
    return {
        "type": "tags_with_separator",
        "tags": tags,
        "separator": "",
        "at_least_one": True,
        "stop_after_first": choice == "forced",
    }


def _triggered(tags: list[dict[str, Any]], at_least_one: bool) -> dict[str, Any]:
    return {
        "type": "triggered_tags",
        "triggers": ["<tool_call>"],
        "tags": tags,
        "at_least_one": at_least_one,
        "stop_after_first": False,
        "excludes": [e for e in _EXCLUDES if e != "<tool_call>"],
    }


def _tag(name: object, content: dict[str, Any]) -> dict[str, Any]:
    return {"type": "tag", "begin": f"<tool_call>{name}", "content": content, "end": "</tool_call>"}


def _schema(schema: object, style: str = "json") -> dict[str, Any]:
    return {
        "type": "json_schema",
        "json_schema": schema,
        "style": style,
        "any_order": False,
        "max_whitespace_cnt": None,
        "excludes": [],
    }


def _strict_tag(function: dict[str, Any]) -> dict[str, Any]:
    parameters = function.get("parameters")
    return _tag(
        function.get("name"), _schema(parameters if parameters is not None else True, "glm_xml")
    )


def _shallow_tag(function: dict[str, Any]) -> dict[str, Any]:
    parameters = function.get("parameters") or {}
    properties = parameters.get("properties") if isinstance(parameters, dict) else None
    if (
        not isinstance(properties, dict)
        or not properties
        or parameters.get("additionalProperties") is True
        or any(key in parameters for key in _SCHEMA_KEYS)
    ):
        return _tag(function.get("name"), _schema(True, "glm_xml"))
    pairs = [
        {
            "type": "sequence",
            "elements": [
                _const(f"{_KEY_OPEN}{key}{_KEY_CLOSE}{_VALUE_OPEN}"),
                _value_format(prop),
                _const(_VALUE_CLOSE),
            ],
        }
        for key, prop in properties.items()
    ]
    content = pairs[0] if len(pairs) == 1 else {"type": "or", "elements": pairs}
    return _tag(function.get("name"), {"type": "star", "content": content})


def _value_format(prop: dict[str, Any]) -> dict[str, Any]:
    if "enum" in prop:
        values = [_const(v if isinstance(v, str) else json.dumps(v)) for v in prop["enum"]]
        return values[0] if len(values) == 1 else {"type": "or", "elements": values}
    kind = prop.get("type")
    if isinstance(kind, list):
        formats = [_value_format({"type": t}) for t in kind if t != "string"]
        if "string" in kind:
            formats.append(_any_text())
        return formats[0] if len(formats) == 1 else {"type": "or", "elements": formats}
    if kind in (None, "string"):
        return _any_text()
    return _schema({"type": kind})


def _const(value: str) -> dict[str, Any]:
    return {"type": "const_string", "value": value}


def _any_text() -> dict[str, Any]:
    return {"type": "any_text", "excludes": list(_EXCLUDES), "max_tokens": None, "max_chars": None}


class Glm45(EngineFamily, frozen=True, dict=True):
    """GLM's halves; vLLM constrains auto tool calls by default (level "function")."""

    default_strict_level: ClassVar[str] = "function"


def build_reasoning(facts: TokenizerFacts) -> Glm45:
    """GLM's reasoning half for this tokenizer (thinking honours `enable_thinking`)."""
    return Glm45(spec=_spec(facts), role="reasoning", honours_enable_thinking=True)


def build_tool(facts: TokenizerFacts) -> Glm45:
    """GLM's tool-call half for this tokenizer, with vLLM's `glm_4_7` structural tag."""
    return Glm45(spec=_spec(facts), role="tool", tag_builder=structural_tag)
