"""Logprob token text: the golden logprob cases, and U+FFFD repair of cut characters."""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from parsers.logprob_text import LOGPROB_CONTEXT_IDS, logprob_context, logprob_token_text

SHARED = Path(__file__).resolve().parents[2] / ".." / "shared"
GOLDEN = SHARED / "golden"
DIRS = (
    "qwen3-noparser",
    "qwen3",
    "qwen2.5-instruct",
    "llama-3.1-instruct",
    "deepseek-r1-distill-qwen",
)


def _decoder(model: str) -> Any:
    tokenizers = pytest.importorskip("tokenizers")
    path = SHARED / "models" / model / "tokenizer.json"
    tok = tokenizers.Tokenizer.from_file(str(path))

    def decode(ids: Sequence[int]) -> str:
        text: str = tok.decode(list(ids), skip_special_tokens=False)
        return text

    return decode


def _logprob_cases() -> Iterator[Any]:
    if not GOLDEN.is_dir():
        return
    for directory in DIRS:
        for path in sorted((GOLDEN / directory / "derender").glob("*.json")):
            text = path.read_text(encoding="utf-8")
            if '"top_logprobs"' in text or '"logprobs": 2' in text:
                case = json.loads(text)
                if case.get("kind") and case.get("status") == 200:
                    yield pytest.param(case, id=f"{directory}/{case['name']}")


def _returned_tokens(choice: dict[str, Any]) -> list[tuple[str, list[str]]]:
    """(sampled token, candidate tokens) per position, from a chat or completion choice."""
    logprobs = choice["logprobs"]
    if "content" in logprobs:
        return [(e["token"], [t["token"] for t in e["top_logprobs"]]) for e in logprobs["content"]]
    return [
        (t, list(top or {}))
        for t, top in zip(logprobs["tokens"], logprobs["top_logprobs"], strict=True)
    ]


def _resolve(
    decode: Any, entries: list[dict[str, Any]], context: tuple[int, ...]
) -> tuple[list[tuple[str, list[str]]], tuple[int, ...]]:
    """Our text for every generate logprob entry, carrying the repair context along."""
    resolved = []
    for entry in entries:
        top = [logprob_token_text(decode, t["token_id"], context) for t in entry["top_logprobs"]]
        resolved.append((logprob_token_text(decode, entry["token_id"], context), top))
        context = logprob_context(context, [entry["token_id"]])
    return resolved, context


def _comparable(
    ours: list[tuple[str, list[str]]], expected: list[tuple[str, list[str]]], completion: bool
) -> list[tuple[str, list[str]]]:
    """Ours, cut as vLLM cuts candidates (a derender-layer rule) to line up with its answer."""
    cut = []
    for (token, top), (_, returned_top) in zip(ours, expected, strict=False):
        # Completion logprobs are a dict keyed by token text, so equal texts collapse.
        candidates = list(dict.fromkeys(top)) if completion else top
        cut.append((token, candidates[: len(returned_top)]))
    return cut


@pytest.mark.skipif(not GOLDEN.is_dir(), reason="../shared/golden is absent")
@pytest.mark.parametrize("case", list(_logprob_cases()))
def test_golden_logprob_tokens(case: dict[str, Any]) -> None:
    decode = _decoder(case["model"])
    completion = case["kind"] == "completion"
    body = case["request"]
    responses = body.get("generate_responses") or [body["generate_response"]]
    generated = [c for r in responses for c in r["choices"]]
    for gen, returned in zip(generated, case["response"]["choices"], strict=True):
        if gen["logprobs"] is None:
            continue
        ours, _ = _resolve(decode, gen["logprobs"]["content"], ())
        expected = _returned_tokens(returned)
        assert _comparable(ours, expected, completion) == expected

    for chunking in case.get("stream", {}).get("chunkings", {}).values():
        context: tuple[int, ...] = ()
        for call in chunking["calls"]:
            choices = call["generate_chunk"]["choices"]
            if call["status"] != 200 or not choices or choices[0]["logprobs"] is None:
                continue
            ours, context = _resolve(decode, choices[0]["logprobs"]["content"], context)
            returned = call["chunk"]["choices"][0]
            if returned.get("logprobs") is None:
                continue
            expected = _returned_tokens(returned)
            assert _comparable(ours, expected, completion) == expected


def _byte_ids(model: str) -> dict[int, int]:
    """Ids of the single-byte tokens 0x80-0xFF of a byte-level vocabulary."""
    tokenizers = pytest.importorskip("tokenizers")
    tok = tokenizers.Tokenizer.from_file(str(SHARED / "models" / model / "tokenizer.json"))
    printable = [*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    chars = {b: chr(b) for b in printable}
    extra = 0
    for b in range(256):
        if b not in chars:
            chars[b] = chr(256 + extra)
            extra += 1
    return {b: tok.token_to_id(chars[b]) for b in range(0x80, 0x100)}


@pytest.mark.skipif(not (SHARED / "models" / "qwen3").is_dir(), reason="../shared/models is absent")
def test_cut_character_is_repaired_from_preceding_ids() -> None:
    decode = _decoder("qwen3")
    byte_ids = _byte_ids("qwen3")
    first, second, third, last = (byte_ids[b] for b in "😀".encode())
    word = decode([9707])  # an ordinary token keeps its own text

    assert logprob_token_text(decode, 9707, [first]) == word
    # The byte that completes the character carries it whole; its cut predecessors do not.
    assert logprob_token_text(decode, last, [9707, first, second, third]) == "😀"
    assert logprob_token_text(decode, second, [9707, first]) == ""
    assert logprob_token_text(decode, first, []) == ""
    # Context further back than the last few sampled ids is not looked at.
    far = [first, second, third, *([9707] * LOGPROB_CONTEXT_IDS)]
    assert logprob_token_text(decode, last, far) == ""


def test_context_keeps_the_last_sampled_ids() -> None:
    assert logprob_context((1, 2, 3), [4, 5]) == (2, 3, 4, 5)[-LOGPROB_CONTEXT_IDS:]
    assert logprob_context((), [7]) == (7,)
