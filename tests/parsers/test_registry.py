"""The registry builds every family; names, errors, ids and the public API."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import msgspec
import pytest

import parsers
from parsers import (
    ChatState,
    ParseRequest,
    TokenizerFacts,
    UnknownParserError,
    UnsupportedModelError,
    build_chat_parser,
    known_reasoning_parsers,
    known_tool_parsers,
    tool_call_id,
)
from parsers.family import FamilyState
from parsers.registry import FAMILIES

# The markers every registered family may need, with Qwen-like ids (no tokenizer needed).
# Harmony's framing tokens (gpt-oss ids), with their bytes: the family reads output as bytes.
HARMONY = {
    "<|return|>": 200002,
    "<|start|>": 200006,
    "<|end|>": 200007,
    "<|message|>": 200008,
    "<|call|>": 200012,
}
TOKEN_BYTES = tuple(
    {**{i: t.encode() for t, i in HARMONY.items()}, 9707: b"Hello"}.get(i, b"")
    for i in range(200013)
)
FACTS = TokenizerFacts.from_added_tokens(
    {
        "<|endoftext|>": 151643,
        "<|im_start|>": 151644,
        "<|im_end|>": 151645,
        "<tool_call>": 151657,
        "</tool_call>": 151658,
        "<think>": 151667,
        "</think>": 151668,
        "<|python_tag|>": 128010,
        "<｜tool▁calls▁begin｜>": 128806,
        "<｜tool▁calls▁end｜>": 128807,
        "<｜tool▁call▁begin｜>": 128808,
        "<｜tool▁call▁end｜>": 128809,
        "<｜tool▁sep｜>": 128814,
        **HARMONY,
        "<minimax:tool_call>": 200052,
        "</minimax:tool_call>": 200053,
        "[TOOL_CALLS]": 9,
    },
    special_ids=[151643, 151644, 151645],
    token_bytes=TOKEN_BYTES,
)
REQUEST = ParseRequest(
    tools=[{"type": "function", "function": {"name": "f"}}], enable_auto_tools=True
)


def test_vllm_names_registered() -> None:
    assert set(known_reasoning_parsers()) >= {
        "qwen3",
        "deepseek_r1",
        "deepseek_v3",
        "openai_gptoss",
    }
    assert set(known_tool_parsers()) >= {
        "hermes",
        "qwen3_coder",
        "qwen3_xml",
        "llama3_json",
        "llama4_json",
        "deepseek_v31",
        "openai",
    }


@pytest.mark.parametrize("family", FAMILIES, ids=lambda f: f"{f.kind}:{f.name}")
def test_every_family_builds_and_parses(family: parsers.registry.ParserFamily) -> None:
    reasoning = family.name if family.kind == "reasoning" else None
    tool = family.name if family.kind == "tool" else None
    parser = build_chat_parser(reasoning, tool, FACTS, REQUEST)
    assert parser is not None
    state = parser.start([151644, 77091, 198])
    state, _ = parser.feed(state, [9707], "Hello")
    parser.finish(state)


def test_nothing_configured_gives_none() -> None:
    assert build_chat_parser(None, None, FACTS, REQUEST) is None


@pytest.mark.parametrize(("reasoning", "tool"), [("nope", None), (None, "nope"), ("hermes", None)])
def test_unknown_name(reasoning: str | None, tool: str | None) -> None:
    with pytest.raises(UnknownParserError, match="unknown"):
        build_chat_parser(reasoning, tool, FACTS, REQUEST)
    assert issubclass(UnknownParserError, ValueError)


def test_missing_marker_token() -> None:
    facts = TokenizerFacts.from_added_tokens({"<|im_end|>": 2})
    with pytest.raises(UnsupportedModelError, match="<think>"):
        build_chat_parser("qwen3", None, facts, REQUEST)


def test_tool_call_id_deterministic() -> None:
    first = tool_call_id("chatcmpl-abc", 0, 1)
    assert first == tool_call_id("chatcmpl-abc", 0, 1)
    assert re.fullmatch(r"chatcmpl-tool-[0-9a-f]{16}", first)
    others = {tool_call_id("chatcmpl-abc", 0, 0), tool_call_id("chatcmpl-abc", 1, 1)}
    assert first not in others


def test_public_names_are_exactly_all() -> None:
    public = {name for name in vars(parsers) if not name.startswith("_")}
    modules = {name for name, value in vars(parsers).items() if type(value) is type(parsers)}
    assert public - modules - {"annotations"} == set(parsers.__all__)


def test_every_state_type_is_a_tagged_family_state() -> None:
    states = {row.state for row in FAMILIES if row.state is not None}
    assert all(issubclass(state, FamilyState) for state in states)
    tags = [state.__struct_config__.tag for state in states]
    assert None not in tags and len(set(tags)) == len(tags)
    tool_rows = [row for row in FAMILIES if row.kind == "tool"]
    assert all(row.state is not None for row in tool_rows), "a tool family has a stream state"


@pytest.mark.parametrize(
    "family", [f for f in FAMILIES if f.kind == "tool"], ids=lambda f: f"tool:{f.name}"
)
def test_every_tool_family_state_travels_in_the_chat_state(
    family: parsers.registry.ParserFamily,
) -> None:
    parser = build_chat_parser(None, family.name, FACTS, REQUEST)
    assert parser is not None
    state = parser.start([151644, 77091, 198])
    if parser.chat is not None:  # a chat family (Harmony, an engine family) keeps its own state
        state, _ = parser.feed(state, [HARMONY["<|message|>"], 9707], "<|message|>Hello")
    else:
        assert parser.tools is not None
        start = next((m for m in parser.tools.markers() if m.role == "start"), None)
        if start is None:  # no start token: the answer itself holds the calls (pythonic)
            state, _ = parser.feed(state, [9707], "[f(argu")
        else:
            state, _ = parser.feed(
                state, [start.token_id, 9707], start.text + '{"name": "f", "argu'
            )
    assert isinstance(state.call, family.state)
    for codec in (msgspec.json, msgspec.msgpack):
        assert codec.decode(codec.encode(state), type=ChatState) == state


def test_only_the_registry_imports_family_modules() -> None:
    """A family touches no shared module: chat.py and the helpers name no family."""
    package = Path(parsers.__file__).parent
    for path in package.glob("*.py"):
        imported: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.module:
                imported |= {f"{node.module}.{alias.name}" for alias in node.names}
            elif isinstance(node, ast.Import):
                imported |= {alias.name for alias in node.names}
        families = {
            name for name in imported if name.startswith(("parsers.tools.", "parsers.reasoning."))
        }
        assert not families or path.name == "registry.py", (path.name, families)
