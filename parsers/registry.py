"""The one table from vLLM's CLI parser names to parser families."""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal

import msgspec

from parsers.chat import ChatParser
from parsers.errors import UnknownParserError
from parsers.facts import TokenizerFacts
from parsers.reasoning import ReasoningConfig, deepseek_r1, qwen3
from parsers.request import ParseRequest
from parsers.tools import ToolConfig, hermes, llama3_json, qwen3_coder

__all__ = [
    "FAMILIES",
    "ParserFamily",
    "build_chat_parser",
    "known_reasoning_parsers",
    "known_tool_parsers",
]


class ParserFamily(msgspec.Struct, frozen=True):
    """One registry row: the CLI name, its kind and how to configure it for a tokenizer."""

    name: str
    kind: Literal["reasoning", "tool"]
    build: Callable[[TokenizerFacts], ReasoningConfig | ToolConfig]


#: `--reasoning-parser` / `--tool-call-parser` names, as vLLM 0.33 spells them.
FAMILIES: tuple[ParserFamily, ...] = (
    ParserFamily("qwen3", "reasoning", qwen3.build),
    ParserFamily("deepseek_r1", "reasoning", deepseek_r1.build),
    ParserFamily("hermes", "tool", hermes.build),
    ParserFamily("qwen3_coder", "tool", qwen3_coder.build),
    ParserFamily("qwen3_xml", "tool", qwen3_coder.build),
    ParserFamily("llama3_json", "tool", llama3_json.build),
    ParserFamily("llama4_json", "tool", llama3_json.build),
)


def known_reasoning_parsers() -> list[str]:
    """Registered `--reasoning-parser` names."""
    return [f.name for f in FAMILIES if f.kind == "reasoning"]


def known_tool_parsers() -> list[str]:
    """Registered `--tool-call-parser` names."""
    return [f.name for f in FAMILIES if f.kind == "tool"]


def _family(name: str, kind: Literal["reasoning", "tool"]) -> ParserFamily:
    for family in FAMILIES:
        if family.name == name and family.kind == kind:
            return family
    known = ", ".join(f.name for f in FAMILIES if f.kind == kind)
    raise UnknownParserError(f"unknown {kind} parser {name!r}; known: {known}")


def build_chat_parser(
    reasoning: str | None,
    tool: str | None,
    facts: TokenizerFacts,
    request: ParseRequest,
    *,
    tool_strict_level: str = "auto",
) -> ChatParser | None:
    """The parser for one request, or None when no parser applies (plain detokenization).

    As in vLLM, a tool parser counts only with `request.enable_auto_tools`
    (`--enable-auto-tool-choice`). Unknown names raise `UnknownParserError` either way.
    """
    reasoning_config: ReasoningConfig | None = None
    tool_config: ToolConfig | None = None
    if reasoning is not None:
        built = _family(reasoning, "reasoning").build(facts)
        if not isinstance(built, ReasoningConfig):
            raise UnknownParserError(f"{reasoning!r} is not a reasoning parser")
        reasoning_config = built
    if tool is not None:
        built_tool = _family(tool, "tool").build(facts)
        if isinstance(built_tool, ReasoningConfig):
            raise UnknownParserError(f"{tool!r} is not a tool parser")
        if request.enable_auto_tools:
            tool_config = built_tool
    if reasoning_config is None and tool_config is None:
        return None
    return ChatParser.build(reasoning_config, tool_config, request, tool_strict_level)
