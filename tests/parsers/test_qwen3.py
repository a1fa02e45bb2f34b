"""qwen3 reasoning (+ hermes tools) against vLLM 0.33.0's golden derender cases."""

from __future__ import annotations

from pathlib import Path

import pytest

from parsers import ParseRequest, ReasoningDelta, build_chat_parser
from tests.parsers import _golden as g

DUPLICATE_END = (
    "a second </think> in the answer is dropped whatever the chunking (vLLM: only batch and whole)"
)

STREAM: g.Divergences = {
    ("duplicate_end_think", "one_token"): ("stream:whole", DUPLICATE_END),
    ("duplicate_end_think", "random_1_5"): ("stream:whole", DUPLICATE_END),
}
# The batch answer is ChatParser.parse_batch (the documented batch rule), which gives vLLM's
# batch answers for whitespace beside calls, cut calls and forced choices.
BATCH: g.Divergences = {
    ("stop_string", "batch"): ("prefix", "stop strings are cut by the derender layer"),
}

CASES = g.chat_cases("qwen3")


@pytest.mark.skipif(not g.shared_present(), reason="../shared (golden corpus) is absent")
@pytest.mark.parametrize("path", CASES, ids=[p.stem for p in CASES])
def test_golden_case(path: Path) -> None:
    g.check_case(path, STREAM, BATCH)


@pytest.mark.skipif(not g.shared_present(), reason="../shared (models) is absent")
def test_enable_thinking_false_starts_in_content() -> None:
    tok = g.tokenizer("qwen3")
    request = ParseRequest(chat_template_kwargs={"enable_thinking": False})
    parser = build_chat_parser("qwen3", None, g.facts("qwen3"), request)
    assert parser is not None
    state = parser.start([])
    ids = tok.encode("Hello there", add_special_tokens=False).ids
    _, events = parser.feed(state, ids, tok.decode(ids, skip_special_tokens=False))
    assert not any(isinstance(e, ReasoningDelta) for e in events)


@pytest.mark.skipif(not g.shared_present(), reason="../shared (models) is absent")
def test_prompt_look_back_stops_at_turn_boundary() -> None:
    # A closed think block in an earlier turn must not close reasoning for the new turn.
    tok = g.tokenizer("qwen3")
    parser = build_chat_parser("qwen3", None, g.facts("qwen3"), ParseRequest())
    assert parser is not None
    closed = tok.encode(
        "<|im_start|>assistant\n<think>\n\n</think>\n\nHi", add_special_tokens=False
    ).ids
    assert parser.reasoning_ended(closed) is True
    new_turn = (
        closed + tok.encode("<|im_end|>\n<|im_start|>assistant\n", add_special_tokens=False).ids
    )
    assert parser.reasoning_ended(new_turn) is False


@pytest.mark.skipif(not g.shared_present(), reason="../shared (models) is absent")
def test_include_reasoning_false_hides_reasoning() -> None:
    tok = g.tokenizer("qwen3")
    parser = build_chat_parser(
        "qwen3", None, g.facts("qwen3"), ParseRequest(include_reasoning=False)
    )
    assert parser is not None
    ids = tok.encode("<think>secret</think>answer", add_special_tokens=False).ids
    events = g.run(parser, "qwen3", [], [ids])
    msg = g.accumulate(events)
    assert (msg.reasoning, msg.content) == (None, "answer")
    assert parser.reasoning_ended([]) is True


@pytest.mark.skipif(not g.shared_present(), reason="../shared (models) is absent")
def test_tool_call_inside_reasoning_ends_it() -> None:
    tok = g.tokenizer("qwen3")
    tools = [{"type": "function", "function": {"name": "f"}}]
    request = ParseRequest(tools=tools, enable_auto_tools=True)
    parser = build_chat_parser("qwen3", "hermes", g.facts("qwen3"), request)
    assert parser is not None
    text = '<think>plan<tool_call>{"name": "f", "arguments": {}}</tool_call>'
    ids = tok.encode(text, add_special_tokens=False).ids
    msg = g.accumulate(g.run(parser, "qwen3", [], [[i] for i in ids]))
    assert (msg.reasoning, msg.content, msg.calls()) == ("plan", None, [("f", "{}")])


@pytest.mark.skipif(not g.shared_present(), reason="../shared (models) is absent")
def test_thinking_off_keeps_a_written_think_block_in_content() -> None:
    # Issue 16: with enable_thinking false, a model that still writes <think>…</think> lost the
    # </think> from content (vLLM keeps both tags). The duplicate-</think> rule only applies
    # after reasoning this output actually had.
    tok = g.tokenizer("qwen3")
    request = ParseRequest(chat_template_kwargs={"enable_thinking": False})
    parser = build_chat_parser("qwen3", None, g.facts("qwen3"), request)
    assert parser is not None
    text = "<think>\nstill thinking\n</think>\n\nThe answer."
    ids = tok.encode(text, add_special_tokens=False).ids
    prompt = tok.encode(
        "<|im_start|>assistant\n<think>\n\n</think>\n\n", add_special_tokens=False
    ).ids
    for chunks in ([ids], [[i] for i in ids]):
        msg = g.accumulate(g.run(parser, "qwen3", prompt, chunks))
        assert (msg.reasoning, msg.content) == (None, text)
    batch = parser.parse_batch(prompt, ids, text)
    assert (batch.reasoning, batch.content) == (None, text)
