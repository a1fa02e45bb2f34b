"""A faster encoder for byte-level BPE tokenizers whose vocabulary is a tiktoken rank table.

Qwen, Llama 3 and gpt-oss tokenizers were converted from tiktoken-style ranks: a token's id is its
rank, and encoding a pre-token merges by rank. For those, tiktoken's Rust encoder gives the same ids
as Hugging Face ``tokenizers`` several times faster. We build it from ``tokenizer.json`` (vocabulary,
split regex, NFC or no normalizer) and use it only after it reproduces ``tokenizers`` exactly on a
varied sample; any other tokenizer keeps the ``tokenizers`` path.
"""

from __future__ import annotations

import os
import unicodedata
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import msgspec
import tokenizers

# Below this many characters in a batch, encoding on the calling thread is faster.
_PARALLEL_CHARS = 16384

# Texts that exercise the split regex, normalization and byte handling of any family.
CHECK_TEXTS = (
    "Hello, world! It's 12:30 — don't panic; we'll see. 1234567890 3.14159",
    "l'été était très chaud; Ça va? naïve café résumé e\u0301 A\u030a Å",
    "Да, конечно! 你好，世界。こんにちは テスト 한국어 텍스트 ภาษาไทย العربية हिन्दी",
    "emoji 🌍🇫🇷👩‍👩‍👧 🤖✨ zero\u200bwidth tabs\t\tand\r\nCRLF\n\n\n  spaces   end  ",
    "def f(x):\n    return {'a': [1, 2, 3]}  # comment\n\tSELECT * FROM t WHERE id=42;",
    '<div class="x">&amp;</div> https://example.com/a?b=c&d=e ~~~ ``` +++ ---',
    "ALLCAPS MixedCase camelCaseWord snake_case_word kebab-case-word O'Neil I'M WE'RE",
    "\u00a0non-breaking\u2003em-space\u3000ideographic\ufeffbom\U0001f600\U0010fffd",
)


def byte_decoder() -> dict[str, int]:
    """GPT-2's mapping of bytes to printable characters, inverted."""
    printable = [
        *range(ord("!"), ord("~") + 1),
        *range(ord("¡"), ord("¬") + 1),
        *range(ord("®"), ord("ÿ") + 1),
    ]
    chars = list(printable)
    extra = 0
    for byte in range(256):
        if byte not in printable:
            printable.append(byte)
            chars.append(256 + extra)
            extra += 1
    return {chr(c): b for b, c in zip(printable, chars, strict=True)}


def _byte_table() -> dict[int, str]:
    """A ``str.translate`` table taking a token's characters to the bytes they stand for (as
    Latin-1 characters); any character outside GPT-2's mapping becomes one Latin-1 cannot encode."""
    table = {ord(char): chr(byte) for char, byte in byte_decoder().items()}
    for code in range(256):
        table.setdefault(code, "\uffff")
    return table


def _ranks(vocab: dict[str, int]) -> dict[bytes, int] | None:
    """The vocabulary as tiktoken's rank table, or None if a token is not byte-level."""
    table = _byte_table()
    ranks = {}
    try:
        for token, rank in vocab.items():
            ranks[token.translate(table).encode("latin-1")] = rank
    except UnicodeEncodeError:
        return None
    return ranks


def _split_regex(pre_tokenizer: dict[str, Any] | None) -> str | None:
    """The Split regex of a ``Sequence[Split(regex), ByteLevel(use_regex=False)]`` pre-tokenizer."""
    if not pre_tokenizer or pre_tokenizer.get("type") != "Sequence":
        return None
    steps = pre_tokenizer.get("pretokenizers") or []
    if len(steps) != 2:
        return None
    split, byte_level = steps
    if (
        split.get("type") != "Split"
        or split.get("behavior") != "Isolated"
        or split.get("invert")
        or byte_level.get("type") != "ByteLevel"
        or byte_level.get("use_regex")
        or byte_level.get("add_prefix_space")
    ):
        return None
    regex = (split.get("pattern") or {}).get("Regex")
    return regex if isinstance(regex, str) else None


class FastEncoder:
    """tiktoken's encoder for one tokenizer, with a thread pool for long batches (``close`` it)."""

    def __init__(self, encoding: Any, nfc: bool) -> None:
        self._encoding = encoding
        self._nfc = nfc
        # tiktoken releases the GIL while encoding, so long parts encode in parallel on this
        # pool; short ones stay on the calling thread (a hand-off costs more than encoding them).
        self._pool = ThreadPoolExecutor(max_workers=os.cpu_count() or 1, thread_name_prefix="bpe")

    def __call__(self, texts: list[str]) -> list[list[int]]:
        if self._nfc:
            texts = [unicodedata.normalize("NFC", t) for t in texts]
        encode: Callable[[str], list[int]] = self._encoding.encode_ordinary
        if len(texts) > 1 and sum(map(len, texts)) >= _PARALLEL_CHARS:
            return list(self._pool.map(encode, texts))
        return [encode(t) for t in texts]

    def close(self) -> None:
        """Stop the pool's threads (after any batch in progress)."""
        self._pool.shutdown()


def build(tokenizer_json: str, backend: tokenizers.Tokenizer) -> FastEncoder | None:
    """A batch encoder equal to ``backend`` on ordinary text, or None when this tokenizer does not fit."""
    try:
        import tiktoken
    except ImportError:
        return None
    spec = msgspec.json.decode(tokenizer_json)
    model = spec.get("model") or {}
    normalizer = spec.get("normalizer")
    regex = _split_regex(spec.get("pre_tokenizer"))
    if model.get("type") != "BPE" or model.get("byte_fallback") or regex is None:
        return None
    if normalizer is not None and normalizer.get("type") != "NFC":
        return None
    ranks = _ranks(model["vocab"])
    if ranks is None:
        return None
    try:
        encoding = tiktoken.Encoding(
            "render-service", pat_str=regex, mergeable_ranks=ranks, special_tokens={}
        )
    except ValueError:
        return None
    encoder = FastEncoder(encoding, nfc=normalizer is not None)
    expected = [
        enc.ids for enc in backend.encode_batch(list(CHECK_TEXTS), add_special_tokens=False)
    ]
    if encoder(list(CHECK_TEXTS)) != expected:
        encoder.close()
        return None
    return encoder
