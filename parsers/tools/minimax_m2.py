"""MiniMax-M2.x reasoning and tool calls (vLLM names: tool `minimax_m2`; reasoning `minimax_m2`
and `minimax_m2_append_think`).

Format (chat template: https://huggingface.co/MiniMaxAI/MiniMax-M2/blob/main/chat_template.jinja)::

    REASONING\\n</think>\\n\\nCONTENT
    <minimax:tool_call>
    <invoke name="NAME">
    <parameter name="KEY">VALUE</parameter>
    </invoke>
    </minimax:tool_call>

The template ends every prompt with `<think>\\n`, so the output starts in reasoning.
`<think>`, `</think>`, `<minimax:tool_call>` and `</minimax:tool_call>` are added tokens
(matched by id); `<invoke name=…>` (double, single or no quotes), `</invoke>`,
`<parameter name=…>` and `</parameter>` are text. An `<invoke>` starts a call in the content
even without the block token, as in vLLM. A value ends at `</parameter>` or at the next
`<parameter name=`; values are typed by the tool's schema (`parsers.schema_values`); a call of a
function that is not in `tools` is dropped with its markup, except that an `<invoke name=` typed
in the content (outside a block) that yields no call stays content, with the text after it.

`minimax_m2` splits the reasoning off (no `</think>`: everything is reasoning).
`minimax_m2_append_think` keeps it in the content: the content is `"<think>"` + the output,
`</think>` included, and tool markup after `</think>` is parsed into calls.
"""

from __future__ import annotations

from typing import Any

import regex

from parsers._lexer import Lexicon
from parsers._tag_engine import (
    ARG_CLOSE,
    ARG_OPEN,
    ARG_TEXT,
    ARGS,
    BETWEEN,
    CLOSE_BLOCK,
    CLOSE_CALL_BETWEEN,
    CONTENT,
    END_REASONING,
    IGNORE,
    K_ARG_TAG,
    K_CALL_END,
    K_CALL_OPEN,
    K_NAME_END,
    K_TEXT,
    K_THINK_END,
    K_THINK_START,
    K_TOOL_END,
    K_TOOL_START,
    MAX_HELD,
    NAME,
    NAME_DONE,
    OPEN_BLOCK,
    OPEN_CALL,
    PREAMBLE,
    REASONING,
    ArgScan,
    EngineSpec,
    marker_kinds,
)
from parsers.engine_family import EngineFamily
from parsers.facts import TokenizerFacts

__all__ = [
    "build_append_think",
    "build_reasoning",
    "build_tool",
    "scan_args",
    "structural_tag",
]

_FAMILY = "minimax_m2"
_BLOCK_OPEN, _BLOCK_CLOSE = "<minimax:tool_call>", "</minimax:tool_call>"

_TABLE = {
    (REASONING, K_THINK_START): IGNORE,
    (REASONING, K_THINK_END): END_REASONING,
    (REASONING, K_TOOL_START): OPEN_BLOCK,
    (CONTENT, K_THINK_END): IGNORE,
    (CONTENT, K_TOOL_START): OPEN_BLOCK,
    (CONTENT, K_TOOL_END): IGNORE,
    (PREAMBLE, K_TOOL_END): CLOSE_BLOCK,
    (BETWEEN, K_TOOL_END): CLOSE_BLOCK,
    (CONTENT, K_CALL_OPEN): OPEN_CALL,
    (PREAMBLE, K_CALL_OPEN): OPEN_CALL,
    (BETWEEN, K_CALL_OPEN): OPEN_CALL,
    (NAME, K_NAME_END): NAME_DONE,
    (ARGS, K_CALL_END): CLOSE_CALL_BETWEEN,
}

_LITERALS = {
    '<invoke name="': K_CALL_OPEN,
    "<invoke name='": K_CALL_OPEN,
    "<invoke name=": K_CALL_OPEN,
    "</invoke>": K_CALL_END,
    '">': K_NAME_END,
    "'>": K_NAME_END,
    ">": K_NAME_END,
    "<parameter name=": K_ARG_TAG,
    "</parameter>": K_ARG_TAG,
}

# The argument grammar of vLLM's MiniMax converter, whitespace allowances included.
_PARAM_OPEN = regex.compile(
    r"<\s*parameter\s+name\s*=\s*(?:\"(?P<dq>[^\"]*)\"|'(?P<sq>[^']*)'|(?P<bare>[^>\s]+))\s*>"
)
_VALUE_END = regex.compile(r"<\s*/\s*parameter\s*>|(?P<next><\s*parameter\s+name\s*=)")

# Argument scanner modes.
_BETWEEN, _VALUE, _SKIP = 0, 1, 2  # _SKIP: a value whose parameter has no name


def scan_args(state: ArgScan, text: str, final: bool) -> tuple[ArgScan, list[tuple[int, str]]]:
    """Read argument text: `<parameter name=K>` opens a value, which runs to `</parameter>`
    or to the next `<parameter name=`; other text between values is ignored. A tail that may
    still grow into a tag is held (at most the tag's length plus its name)."""
    mode, text = state.mode, state.buf + text
    ops: list[tuple[int, str]] = []
    while text:
        if mode == _BETWEEN:
            found = _PARAM_OPEN.search(text)
            if found is None:
                tail = "" if final else _partial_tail(text, _PARAM_OPEN)
                return ArgScan(_BETWEEN, tail), ops
            name = (found.group("dq") or found.group("sq") or found.group("bare") or "").strip()
            if name:
                ops.append((ARG_OPEN, name))
            mode, text = (_VALUE if name else _SKIP), text[found.end() :]
            continue
        found = _VALUE_END.search(text)
        if found is None:
            tail = "" if final else _partial_tail(text, _VALUE_END)
            value = text[: len(text) - len(tail)]
            if value and mode == _VALUE:
                ops.append((ARG_TEXT, value))
            return ArgScan(mode, tail), ops
        if found.start() and mode == _VALUE:
            ops.append((ARG_TEXT, text[: found.start()]))
        if mode == _VALUE:
            ops.append((ARG_CLOSE, ""))
        mode = _BETWEEN
        text = text[found.start() :] if found.group("next") else text[found.end() :]
    return ArgScan(mode), ops


def _partial_tail(text: str, pattern: regex.Pattern[str]) -> str:
    """The tail from the first "<" that may still grow into a match of `pattern` (within the
    last MAX_HELD characters, so the state stays bounded)."""
    at = text.find("<", max(0, len(text) - MAX_HELD))
    while at >= 0:
        if pattern.fullmatch(text, at, partial=True) is not None:
            return text[at:]
        at = text.find("<", at + 1)
    return ""


def _spec(facts: TokenizerFacts) -> EngineSpec:
    ids = {
        K_THINK_START: facts.marker_id("<think>", _FAMILY),
        K_THINK_END: facts.marker_id("</think>", _FAMILY),
        K_TOOL_START: facts.marker_id(_BLOCK_OPEN, _FAMILY),
        K_TOOL_END: facts.marker_id(_BLOCK_CLOSE, _FAMILY),
    }
    markers = marker_kinds(facts, ids)
    literals = {spelling: K_TEXT for _, spelling in markers.values()}
    literals.update(_LITERALS)
    return EngineSpec(
        family=_FAMILY,
        lexicon=Lexicon(literals),
        markers=markers,
        table=_TABLE,
        args=scan_args,
        spellings={token_id: spelling for token_id, (_, spelling) in markers.items()},
        think_start_id=ids[K_THINK_START],
        think_end_id=ids[K_THINK_END],
        end_ids=frozenset((ids[K_THINK_END], ids[K_TOOL_START])),
        boundary_ids=frozenset(),
        args_value_mode=_VALUE,
    )


def structural_tag(functions: list[dict[str, Any]], choice: str) -> dict[str, Any]:
    """vLLM's `minimax` structural tag format for these tools and choice."""
    tags = [
        {
            "type": "tag",
            "begin": f'<invoke name="{function.get("name")}">\n',
            "content": {
                "type": "json_schema",
                "json_schema": _parameters(function),
                "style": "minimax_xml",
                "any_order": False,
                "max_whitespace_cnt": None,
                "excludes": [],
            },
            "end": "</invoke>\n",
        }
        for function in functions
    ]
    calls = {
        "type": "tags_with_separator",
        "tags": tags,
        "separator": "",
        "at_least_one": True,
        "stop_after_first": choice == "forced",
    }
    if choice != "auto":
        return {
            "type": "sequence",
            "elements": [_const("\n" + _BLOCK_OPEN + "\n"), calls, _const(_BLOCK_CLOSE)],
        }
    if not tags:
        return {"type": "any_text", "excludes": ["<think>", "</think>"], "max_tokens": None,
                "max_chars": None}  # fmt: skip
    block = {"type": "tag", "begin": _BLOCK_OPEN + "\n", "content": calls, "end": _BLOCK_CLOSE}
    return {
        "type": "triggered_tags",
        "triggers": [_BLOCK_OPEN],
        "tags": [block],
        "at_least_one": False,
        "stop_after_first": False,
        "excludes": ["<think>", "</think>"],
    }


def _parameters(function: dict[str, Any]) -> object:
    """A non-strict tool's arguments are free; a strict one's follow its schema."""
    if function.get("strict") is False:
        return True
    parameters = function.get("parameters")
    return parameters if parameters is not None else True


def _const(value: str) -> dict[str, Any]:
    return {"type": "const_string", "value": value}


def build_reasoning(facts: TokenizerFacts) -> EngineFamily:
    """`minimax_m2`: everything before `</think>` is reasoning."""
    return EngineFamily(spec=_spec(facts), role="reasoning")


def build_append_think(facts: TokenizerFacts) -> EngineFamily:
    """`minimax_m2_append_think`: the reasoning stays in the content after `"<think>"`."""
    return EngineFamily(spec=_spec(facts), role="reasoning", append_think=True)


def build_tool(facts: TokenizerFacts) -> EngineFamily:
    """MiniMax's tool-call half, with vLLM's `minimax` structural tag."""
    return EngineFamily(spec=_spec(facts), role="tool", tag_builder=structural_tag)
