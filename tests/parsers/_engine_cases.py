"""Outputs generated from the GLM and MiniMax grammars, for split-invariance and size tests.

Each output mixes reasoning, content, calls (valid, unknown, cut, malformed), whitespace and
characters that start tags, so that every hold-back path of the engine is crossed at random
split points.
"""

from __future__ import annotations

from hypothesis import strategies as st

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {
                "type": "object",
                "properties": {
                    "city": {"type": "string"},
                    "unit": {"type": "string", "enum": ["c", "f"]},
                    "days": {"type": "integer"},
                },
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "cfg",
            "parameters": {
                "type": "object",
                "properties": {
                    "n": {"type": "number"},
                    "on": {"type": "boolean"},
                    "o": {"type": "object"},
                    "l": {"type": ["array", "null"]},
                    "s": {"type": "string"},
                },
            },
        },
    },
    {"type": "function", "function": {"name": "free"}},
]

_PIECES = ["Paris", " the", "\n", "\n\n", " ", "é", "天", "🦜", '"', "<", ">", "/", "'", "[", "]",
           "1", "2.5", "true", "null", '{"a": 1}', "[1, 2]"]  # fmt: skip
_KEYS = ["city", "unit", "days", "n", "on", "o", "l", "s", "zz"]
_NAMES = ["get_weather", "cfg", "free", "nope"]

words = st.lists(st.sampled_from(_PIECES), max_size=5).map("".join)


@st.composite
def glm_call(draw: st.DrawFn) -> str:
    name = draw(st.sampled_from([*_NAMES, " get_weather "]))
    keys = draw(st.lists(st.sampled_from(_KEYS), max_size=3, unique=True))
    args = ""
    for key in keys:
        sep = draw(st.sampled_from(["\n", "", " "]))
        close = draw(st.sampled_from(["</arg_value>", "</arg_value>", ""]))
        args += f"{sep}<arg_key>{key}</arg_key>{sep}<arg_value>{draw(words)}{close}"
    end = draw(st.sampled_from(["\n</tool_call>", "</tool_call>", ""]))
    return f"<tool_call>{name}{args}{end}"


@st.composite
def glm_output(draw: st.DrawFn) -> str:
    out = draw(st.sampled_from(["\n<think>", "<think>", ""])) + draw(words)
    out += draw(st.sampled_from(["</think>", "</think>\n", ""])) + draw(words)
    for call in draw(st.lists(glm_call(), max_size=2)):
        out += call + draw(words)
    return out


@st.composite
def minimax_call(draw: st.DrawFn) -> str:
    quote = draw(st.sampled_from(['"', "'", ""]))
    name = draw(st.sampled_from(_NAMES))
    keys = draw(st.lists(st.sampled_from(_KEYS), max_size=3, unique=True))
    args = ""
    for key in keys:
        close = draw(st.sampled_from(["</parameter>", "</parameter>", ""]))
        args += f"\n<parameter name={quote}{key}{quote}>{draw(words)}{close}"
    end = draw(st.sampled_from(["\n</invoke>", ""]))
    call = f"<invoke name={quote}{name}{quote}>{args}{end}"
    if draw(st.booleans()):
        call = f"<minimax:tool_call>\n{call}\n</minimax:tool_call>"
    return call


@st.composite
def minimax_output(draw: st.DrawFn) -> str:
    out = draw(words) + draw(st.sampled_from(["\n</think>\n\n", "</think>", ""])) + draw(words)
    for call in draw(st.lists(minimax_call(), max_size=2)):
        out += call + draw(words)
    return out
