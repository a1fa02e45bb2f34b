"""Micro-benchmark: parser cost per chunk stays flat as the stream grows.

Feeds 1-token chunks (text given, so detokenization is not measured) after a short prefix that
puts each parser in the phase under test, for streams of 100 to 100,000 tokens, and prints
the mean cost per chunk and tokens/s. Not a test: run it by hand.

    PYTHONPATH=. python bench/parsers_bench.py
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from parsers import ChatParser, ParseRequest, TokenizerFacts, build_chat_parser

# Qwen-family marker ids; the filler id is an ordinary token.
FACTS = TokenizerFacts.from_added_tokens(
    {
        "<|im_start|>": 151644,
        "<|im_end|>": 151645,
        "<tool_call>": 151657,
        "</tool_call>": 151658,
        "<think>": 151667,
        "</think>": 151668,
        "<minimax:tool_call>": 200052,
        "</minimax:tool_call>": 200053,
        # Mistral's control token (tekken id 9); the bench feeds text, so ids only mark it.
        "[TOOL_CALLS]": 9,
    },
    special_ids=[151644, 151645],
)
# DeepSeek-V3.1 marker ids (a family needs its own tokenizer's markers).
DEEPSEEK_FACTS = TokenizerFacts.from_added_tokens(
    {
        "<think>": 128798,
        "</think>": 128799,
        "<｜tool▁calls▁begin｜>": 128806,
        "<｜tool▁calls▁end｜>": 128807,
        "<｜tool▁call▁begin｜>": 128808,
        "<｜tool▁call▁end｜>": 128809,
        "<｜tool▁sep｜>": 128814,
    },
    special_ids=[0, 1],
)
FILLER = (3409, " word")
TOOLS = [{"type": "function", "function": {"name": "f", "parameters": {}}}]
REQUEST = ParseRequest(tools=TOOLS, enable_auto_tools=True)
THINKING = ParseRequest(
    tools=TOOLS, enable_auto_tools=True, chat_template_kwargs={"thinking": True}
)

Scenario = tuple[
    str, str | None, str | None, list[tuple[list[int], str]], TokenizerFacts, ParseRequest
]
# (label, reasoning parser, tool parser, prefix chunks putting the parser in the phase measured,
#  marker ids, request)
SCENARIOS: list[Scenario] = [
    ("qwen3 reasoning", "qwen3", "hermes", [([151667], "<think>")], FACTS, REQUEST),
    ("qwen3 content", "qwen3", "hermes", [([151668], "</think>")], FACTS, REQUEST),
    ("deepseek_r1 reasoning", "deepseek_r1", None, [], FACTS, REQUEST),
    (
        "hermes arguments",
        None,
        "hermes",
        [([151657], "<tool_call>"), ([1, 2], '{"name": "f", "arguments": {"k": "')],
        FACTS,
        REQUEST,
    ),
    (
        "qwen3_coder arguments",
        None,
        "qwen3_coder",
        [([151657], "<tool_call>"), ([1, 2], "<function=f>\n<parameter=k>\n")],
        FACTS,
        REQUEST,
    ),
    ("deepseek_v3 reasoning", "deepseek_v3", "deepseek_v31", [], DEEPSEEK_FACTS, THINKING),
    ("deepseek_v31 content", "deepseek_v3", "deepseek_v31", [], DEEPSEEK_FACTS, REQUEST),
    (
        "deepseek_v31 arguments",
        "deepseek_v3",
        "deepseek_v31",
        [
            ([128806, 128808], "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>"),
            ([69, 128814], "f<｜tool▁sep｜>"),
            ([1, 2], '{"k": "'),
        ],
        DEEPSEEK_FACTS,
        REQUEST,
    ),
    ("glm45 reasoning", "glm45", "glm45", [], FACTS, REQUEST),
    ("glm45 content", "glm45", "glm45", [([151668], "</think>"), ([1], "Hi")], FACTS, REQUEST),
    (
        "glm45 arguments",
        "glm45",
        "glm45",
        [
            ([151668], "</think>"),
            ([151657], "<tool_call>"),
            ([1, 2], "f<arg_key>k</arg_key><arg_value>"),
        ],
        FACTS,
        REQUEST,
    ),
    ("minimax_m2 reasoning", "minimax_m2", "minimax_m2", [], FACTS, REQUEST),
    (
        "minimax_m2 content",
        "minimax_m2",
        "minimax_m2",
        [([151668], "</think>"), ([1], "Hi")],
        FACTS,
        REQUEST,
    ),
    (
        "minimax_m2 arguments",
        "minimax_m2",
        "minimax_m2",
        [([200052], "<minimax:tool_call>"), ([1, 2], '<invoke name="f">\n<parameter name="k">')],
        FACTS,
        REQUEST,
    ),
    ("minimax append-think", "minimax_m2_append_think", "minimax_m2", [], FACTS, REQUEST),
    (
        "mistral arguments",
        None,
        "mistral",
        [([9], "[TOOL_CALLS]"), ([1, 2], '[{"name": "f", "arguments": {"k": "')],
        FACTS,
        REQUEST,
    ),
    ("pythonic arguments", None, "pythonic", [([1, 2], "[f(k='")], FACTS, REQUEST),
]
SIZES = (100, 1_000, 10_000, 100_000)


def per_chunk_seconds(parser: ChatParser, prefix: Sequence[tuple[list[int], str]], n: int) -> float:
    state = parser.start([151644, 77091, 198])
    for ids, text in prefix:
        state, _ = parser.feed(state, ids, text)
    ids, text = [FILLER[0]], FILLER[1]
    feed = parser.feed
    start = time.perf_counter()
    for _ in range(n):
        state, _ = feed(state, ids, text)
    elapsed = time.perf_counter() - start
    parser.finish(state)
    return elapsed / n


def main() -> None:
    header = f"{'parser / phase':<24}" + "".join(f"{f'{n:,} tok':>14}" for n in SIZES)
    print("mean µs per 1-token chunk (tokens/s at 100,000)")
    print(header)
    for label, reasoning, tool, prefix, facts, request in SCENARIOS:
        parser = build_chat_parser(reasoning, tool, facts, request)
        assert parser is not None
        costs = [per_chunk_seconds(parser, prefix, n) for n in SIZES]
        cells = "".join(f"{c * 1e6:>14.2f}" for c in costs)
        print(f"{label:<24}{cells}   ({1 / costs[-1]:,.0f} tok/s)")


if __name__ == "__main__":
    main()
