"""vLLM's own parser unit tests, re-expressed as data (`vllm_cases.json`), run against our parsers.

Each case names the vLLM test it comes from (file and test name), the model output, the request
and the answer expected: a batch answer (`ChatParser.parse_batch`) or the accumulated stream,
which must be the same for every chunking (whole, one piece per token, and random cuts). The
expected answers are vLLM 0.33.0's, asked of its render server. Where they are not, the case
says why (`why`), with what the vLLM test expects (`vllm_test_expects`: newer than 0.33, whose
answer wins) or what 0.33 gives (`vllm_033_gives`: one of our documented divergences).

Tokens are synthetic: marker spellings become their marker ids and every other character is one
token (the parsers see text and marker ids only), so these tests need no tokenizer files.
"""

from __future__ import annotations

import json
import random
import re
from itertools import pairwise
from pathlib import Path
from typing import Any

import pytest

from parsers import (
    ChatParser,
    ParseRequest,
    TokenizerFacts,
    accumulate,
    build_chat_parser,
)
from parsers.message import Message

DATA = json.loads((Path(__file__).parent / "vllm_cases.json").read_text(encoding="utf-8"))
CASES: list[dict[str, Any]] = DATA["cases"]

MARKERS = {
    "<|im_start|>": 151644,
    "<|im_end|>": 151645,
    "<tool_call>": 151657,
    "</tool_call>": 151658,
    "<think>": 151667,
    "</think>": 151668,
    "<|python_tag|>": 128010,
}
FACTS = TokenizerFacts.from_added_tokens(MARKERS, special_ids=[151644, 151645])
_SPLIT = re.compile("(" + "|".join(re.escape(m) for m in MARKERS) + ")")
PLAIN_ID = 1000
# What each prompt ends with: the generation prompt, or the closed think block that Qwen3's
# template writes with enable_thinking false, or DeepSeek-R1's pre-opened <think>.
OPEN_PROMPT = [151644, 77091, 198]
CLOSED_PROMPT = [151644, 77091, 198, 151667, 271, 151668, 271]
R1_PROMPT = [151644, 77091, 198, 151667, 198]


def tokens(text: str) -> list[tuple[int, str]]:
    """(id, text) per token: markers by spelling, one token per other character."""
    out: list[tuple[int, str]] = []
    for piece in _SPLIT.split(text):
        if piece in MARKERS:
            out.append((MARKERS[piece], piece))
        else:
            out.extend((PLAIN_ID, char) for char in piece)
    return out


def parser_for(case: dict[str, Any]) -> ChatParser:
    reasoning, tool = case["parsers"]
    request = ParseRequest(
        tools=DATA["tools"][case["tools"]] if "tools" in case else None,
        tool_choice=case.get("tool_choice"),
        chat_template_kwargs=case.get("chat_template_kwargs", {}),
        enable_auto_tools=tool is not None,
    )
    parser = build_chat_parser(reasoning, tool, FACTS, request)
    assert parser is not None
    return parser


def prompt_for(case: dict[str, Any]) -> list[int]:
    if case["parsers"][0] == "deepseek_r1":
        return R1_PROMPT
    if case.get("chat_template_kwargs", {}).get("enable_thinking") is False:
        return CLOSED_PROMPT
    return OPEN_PROMPT


def as_expected(message: Message) -> dict[str, Any]:
    return {
        "reasoning": message.reasoning,
        "content": message.content,
        "tool_calls": [[c.name, c.arguments] for c in message.tool_calls],
    }


def chunkings(n: int, seed: str) -> list[list[int]]:
    """Cut points: whole, every token, and three random cuttings (seeded by the case id)."""
    rng = random.Random(seed)
    cuts = [[0, n], list(range(n + 1))]
    for _ in range(3):
        cuts.append(sorted({0, n, *rng.sample(range(n + 1), min(n + 1, 6))}))
    return cuts


def run_stream(parser: ChatParser, prompt: list[int], toks: list[tuple[int, str]], cut: list[int]):
    state = parser.start(prompt)
    events = []
    for a, b in pairwise(cut):
        piece = toks[a:b]
        state, more = parser.feed(state, [t for t, _ in piece], "".join(s for _, s in piece))
        events.extend(more)
    _, more = parser.finish(state)
    return accumulate(events + more)


@pytest.mark.parametrize("case", CASES, ids=[f"{c['mode']}:{c['id']}" for c in CASES])
def test_vllm_case(case: dict[str, Any]) -> None:
    parser = parser_for(case)
    prompt = prompt_for(case)
    toks = tokens(case["output"])
    expected = case["expect"]
    if case["mode"] == "batch":
        got = parser.parse_batch(prompt, [t for t, _ in toks], case["output"])
        assert as_expected(got) == expected, case.get("why", "")
        return
    for cut in chunkings(len(toks), case["id"]):
        got = run_stream(parser, prompt, toks, cut)
        assert as_expected(got) == expected, (cut, case.get("why", ""))


def test_cases_name_their_vllm_test() -> None:
    for case in CASES:
        path, _, name = case["id"].partition("::")
        assert re.fullmatch(r"tests/(reasoning|tool_parsers)/test_\w+\.py", path), case["id"]
        assert name.startswith("test_"), case["id"]
        assert case["mode"] in ("batch", "stream")
        if "vllm_test_expects" in case or "vllm_033_gives" in case:
            assert case.get("why"), f"{case['id']}: a divergence needs its reason"
