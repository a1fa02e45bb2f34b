"""deepseek_r1 reasoning against vLLM 0.33.0's golden derender cases."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.parsers import _golden as g

REPEATED_OPEN = (
    "a repeated <think> at the start is absorbed whatever the chunking "
    "(vLLM keeps it only for random_1_5)"
)
THINK_IN_ANSWER = (
    "a <think> token after </think> is answer text; vLLM's whole chunking and batch drop text"
)

STREAM: g.Divergences = {
    ("explicit_think_open", "random_1_5"): ("stream:one_token", REPEATED_OPEN),
    ("think_tag_in_answer", "whole"): ("stream:one_token", THINK_IN_ANSWER),
}
BATCH: g.Divergences = {
    ("think_tag_in_answer", "batch"): ("stream:one_token", THINK_IN_ANSWER),
    ("stop_string", "batch"): ("prefix", "stop strings are cut by the derender layer"),
}

CASES = g.chat_cases("deepseek-r1-distill-qwen")


@pytest.mark.skipif(not g.shared_present(), reason="../shared (golden corpus) is absent")
@pytest.mark.parametrize("path", CASES, ids=[p.stem for p in CASES])
def test_golden_case(path: Path) -> None:
    g.check_case(path, STREAM, BATCH)


@pytest.mark.skipif(not g.shared_present(), reason="../shared (models) is absent")
def test_only_end_think_reports_empty_reasoning() -> None:
    # vLLM: reasoning "" in batch and whole, content "" token by token; we pick the former.
    case = g.load(CASES[0])
    parser = g.chat_parser(case)
    tok = g.tokenizer("deepseek-r1-distill-qwen")
    ids = tok.encode("</think>", add_special_tokens=False).ids
    msg = g.accumulate(g.run(parser, "deepseek-r1-distill-qwen", case["prompt_token_ids"], [ids]))
    assert (msg.reasoning, msg.content) == ("", None)
