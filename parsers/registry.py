"""The one table from vLLM's CLI parser names to parser families."""

from __future__ import annotations

import functools
import operator
from collections.abc import Callable
from typing import Any, Literal, overload

import msgspec

from parsers import harmony
from parsers._tag_engine import EngineState
from parsers.errors import UnknownParserError
from parsers.facts import TokenizerFacts
from parsers.family import ChatFamily, Family, FamilyState, ReasoningFamily, ToolFamily
from parsers.reasoning import deepseek_r1, deepseek_v3, qwen3
from parsers.tools import (
    deepseek_v31,
    glm45,
    hermes,
    llama3_json,
    minimax_m2,
    mistral,
    pythonic,
    qwen3_coder,
)

__all__ = [
    "FAMILIES",
    "ParserFamily",
    "build_family",
    "known_reasoning_parsers",
    "known_tool_parsers",
    "state_union",
]


class ParserFamily(msgspec.Struct, frozen=True):
    """One registry row: the CLI name, its kind, how to build it for a tokenizer, and the
    `FamilyState` subclass its stream state is (None for a reasoning family)."""

    name: str
    kind: Literal["reasoning", "tool"]
    build: Callable[[TokenizerFacts], Family]
    state: type[FamilyState] | None = None


#: `--reasoning-parser` / `--tool-call-parser` names, as vLLM 0.33 spells them.
FAMILIES: tuple[ParserFamily, ...] = (
    ParserFamily("qwen3", "reasoning", qwen3.build),
    ParserFamily("deepseek_r1", "reasoning", deepseek_r1.build),
    ParserFamily("deepseek_v3", "reasoning", deepseek_v3.build),
    ParserFamily("hermes", "tool", hermes.build, hermes.HermesCall),
    ParserFamily("qwen3_coder", "tool", qwen3_coder.build, qwen3_coder.XmlCall),
    ParserFamily("qwen3_xml", "tool", qwen3_coder.build, qwen3_coder.XmlCall),
    ParserFamily("llama3_json", "tool", llama3_json.build, llama3_json.LlamaCall),
    ParserFamily("llama4_json", "tool", llama3_json.build, llama3_json.LlamaCall),
    ParserFamily("deepseek_v31", "tool", deepseek_v31.build, deepseek_v31.DeepSeekV31Section),
    ParserFamily("openai_gptoss", "reasoning", harmony.build, harmony.HarmonyState),
    ParserFamily("openai", "tool", harmony.build, harmony.HarmonyState),
    ParserFamily("glm45", "reasoning", glm45.build_reasoning, EngineState),
    ParserFamily("glm45", "tool", glm45.build_tool, EngineState),
    ParserFamily("glm47", "reasoning", glm45.build_reasoning, EngineState),
    ParserFamily("glm47", "tool", glm45.build_tool, EngineState),
    ParserFamily("minimax_m2", "reasoning", minimax_m2.build_reasoning, EngineState),
    ParserFamily(
        "minimax_m2_append_think", "reasoning", minimax_m2.build_append_think, EngineState
    ),
    ParserFamily("minimax_m2", "tool", minimax_m2.build_tool, EngineState),
    ParserFamily("mistral", "tool", mistral.build, mistral.MistralCalls),
    ParserFamily("pythonic", "tool", pythonic.build, pythonic.PythonicCall),
)


def known_reasoning_parsers() -> list[str]:
    """Registered `--reasoning-parser` names."""
    return [f.name for f in FAMILIES if f.kind == "reasoning"]


def known_tool_parsers() -> list[str]:
    """Registered `--tool-call-parser` names."""
    return [f.name for f in FAMILIES if f.kind == "tool"]


@overload
def build_family(
    name: str, kind: Literal["reasoning"], facts: TokenizerFacts
) -> ReasoningFamily | ChatFamily: ...


@overload
def build_family(
    name: str, kind: Literal["tool"], facts: TokenizerFacts
) -> ToolFamily | ChatFamily: ...


def build_family(name: str, kind: Literal["reasoning", "tool"], facts: TokenizerFacts) -> Family:
    """The family registered as `name` for `kind`, configured for this tokenizer."""
    for row in FAMILIES:
        if row.name == name and row.kind == kind:
            built = row.build(facts)
            wrong = ToolFamily if kind == "reasoning" else ReasoningFamily
            if isinstance(built, wrong):
                raise UnknownParserError(f"{name!r} is not a {kind} parser")
            return built
    known = ", ".join(f.name for f in FAMILIES if f.kind == kind)
    raise UnknownParserError(f"unknown {kind} parser {name!r}; known: {known}")


def state_union() -> Any:
    """The union of every registered `FamilyState` type, for decoding `ChatState.call`."""
    states = dict.fromkeys(row.state for row in FAMILIES if row.state is not None)
    return functools.reduce(operator.or_, states)
