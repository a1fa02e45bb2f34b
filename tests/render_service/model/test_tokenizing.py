"""Encoding through the segment cache gives exactly the ids of one whole-text encode."""

from __future__ import annotations

from functools import cache
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tokenizers import Tokenizer

from render_service.model.default_model import ensure_default_model
from render_service.model.tokenizing import SegmentEncoder
from tests.golden import MODELS

SHARED_MODELS = ["qwen3", "qwen2.5-instruct", "deepseek-r1-distill-qwen", "llama-3.1-instruct"]


@cache
def default_tokenizer(tmp: str) -> Tokenizer:
    return Tokenizer.from_file(str(ensure_default_model(Path(tmp)) / "tokenizer.json"))


def tokenizers_under_test(tmp_path_factory: pytest.TempPathFactory) -> list[Tokenizer]:
    found = [default_tokenizer(str(tmp_path_factory.getbasetemp() / "segment-default-model"))]
    found += [
        Tokenizer.from_file(str(MODELS / m / "tokenizer.json"))
        for m in SHARED_MODELS
        if (MODELS / m / "tokenizer.json").is_file()
    ]
    return found


PIECES = [*"ab Z\n\t 1.,'é한🌍-", "  ", "\n\n", "e\u0301", "'s", "’", "word", " Word", "<|", "|>"]
TEXT = st.lists(st.sampled_from(PIECES), max_size=60).map("".join)


@pytest.fixture(scope="module")
def encoders(tmp_path_factory: pytest.TempPathFactory) -> list[SegmentEncoder]:
    found = tokenizers_under_test(tmp_path_factory)
    return [SegmentEncoder(t, max_entries=64, fast=fast) for t in found for fast in (True, False)]


def test_byte_level_bpe_families_get_the_tiktoken_path(encoders: list[SegmentEncoder]) -> None:
    assert all(e._fast is not None for e in encoders[::2])


@settings(max_examples=150, deadline=None)
@given(data=st.data())
def test_segment_encode_equals_whole_encode(
    encoders: list[SegmentEncoder], data: st.DataObject
) -> None:
    for encoder in encoders:
        added = sorted(encoder._ids)
        parts = data.draw(st.lists(st.one_of(TEXT, st.sampled_from(added)), max_size=8))
        text = "".join(parts)
        expected = encoder.backend.encode(text, add_special_tokens=False).ids
        assert encoder.encode(text) == expected
        assert encoder.encode(text) == expected  # again, now from the cache


def test_long_stretches_are_cached_and_evicted(encoders: list[SegmentEncoder]) -> None:
    encoder = encoders[0]
    system = "You are a careful assistant. " * 10
    text = f"<|im_start|>system\n{system}<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
    first = encoder.encode(text)
    assert len(encoder) >= 1
    assert (
        encoder.encode(text) == first == encoder.backend.encode(text, add_special_tokens=False).ids
    )
    for i in range(100):
        encoder.encode(f"<|im_start|>user\n{'x' * 70} {i}<|im_end|>")
    assert len(encoder) <= encoder.max_entries


@settings(max_examples=25, deadline=None)
@given(words=st.lists(TEXT, min_size=1, max_size=40))
def test_long_stretches_encoded_in_parallel_parts_keep_their_ids(
    encoders: list[SegmentEncoder], words: list[str]
) -> None:
    base = " ".join(words) + " Word"
    text = (base + " ") * (20_000 // len(base) + 1)
    for encoder in encoders:
        assert encoder.parallel
        assert encoder.encode(text) == encoder.backend.encode(text, add_special_tokens=False).ids


@settings(max_examples=300, deadline=None)
@given(text=st.text(max_size=200))
def test_any_unicode_text_encodes_like_tokenizers(
    encoders: list[SegmentEncoder], text: str
) -> None:
    for encoder in encoders[::2]:
        assert encoder.encode(text) == encoder.backend.encode(text, add_special_tokens=False).ids


def _encoded_chars(encoder: SegmentEncoder, text: str) -> tuple[list[int], int]:
    """``text``'s ids, and how many characters went to the tokenizer for them."""
    sent: list[int] = []
    encode_many = encoder._encode_many

    def counting(stretches: list[str]) -> dict[str, list[int]]:
        sent.extend(map(len, stretches))
        return encode_many(stretches)

    encoder._encode_many = counting  # type: ignore[method-assign]
    try:
        return encoder.encode(text), sum(sent)
    finally:
        del encoder._encode_many


@settings(max_examples=40, deadline=None)
@given(
    words=st.lists(TEXT, min_size=1, max_size=30),
    cut=st.floats(0.0, 1.0),
    tail=TEXT,
)
def test_a_stretch_that_begins_like_a_cached_one_reuses_its_chunks(
    encoders: list[SegmentEncoder], words: list[str], cut: float, tail: str
) -> None:
    base = " ".join(words) + " Word"
    first = (base + " ") * (3000 // len(base) + 1)
    second = first[: int(len(first) * cut)] + tail
    for encoder in encoders:
        for text in (first, second, first):
            full = f"<|im_start|>user\n{text}<|im_end|>"
            assert (
                encoder.encode(full) == encoder.backend.encode(full, add_special_tokens=False).ids
            )


def test_only_the_new_end_of_a_grown_stretch_is_encoded(encoders: list[SegmentEncoder]) -> None:
    document = " ".join(f"Line {i} of the report says café costs {i * 7} euros." for i in range(60))
    for encoder in encoders[::2]:  # the tiktoken path (byte-level vocabularies) chunks
        assert encoder._sizes is not None
        encoder.encode(f"<|im_start|>user\n{document} (ref 1)<|im_end|>")
        question = f"<|im_start|>user\n{document} Which line is the cheapest?<|im_end|>"
        ids, sent = _encoded_chars(encoder, question)
        assert ids == encoder.backend.encode(question, add_special_tokens=False).ids
        assert 0 < sent <= 3 * 512
        ids, sent = _encoded_chars(encoder, question)
        assert (ids, sent) == (encoder.backend.encode(question, add_special_tokens=False).ids, 0)


def test_a_long_stretch_seen_again_in_full_is_kept_whole(encoders: list[SegmentEncoder]) -> None:
    document = " ".join(
        f"Tool {i} takes a city and returns its weather in {i} ways." for i in range(40)
    )
    stretch = f"system\n{document}"
    text = f"<|im_start|>{stretch}<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
    chunking = [e for e in encoders[::2] if "<|im_start|>" in e._ids]  # the tiktoken path
    if not chunking:
        pytest.skip("no ChatML tokenizer with the chunking path (../shared models absent)")
    for encoder in chunking:
        expected = encoder.backend.encode(text, add_special_tokens=False).ids
        assert encoder.encode(text) == expected
        assert stretch not in encoder._cache  # first seen: kept as chunks
        assert encoder.encode(text) == expected
        assert stretch in encoder._cache
        ids, sent = _encoded_chars(encoder, text)
        assert (ids, sent) == (expected, 0)


def test_cached_ids_share_one_int_per_vocabulary_id(encoders: list[SegmentEncoder]) -> None:
    for encoder in encoders:
        encoder.encode("<|im_start|>user\nEvery cached list holds the shared ints<|im_end|>")
        assert len(encoder) > 0
        for _, ids in encoder._cache.values():
            assert all(i is encoder._ints[i] for i in ids)
