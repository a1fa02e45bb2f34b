"""The Harmony encoding of gpt-oss models, and the per-id bytes Harmony output is read from.

vLLM 0.33 renders gpt-oss chats with the `oss-harmony` package (module `openai_harmony`). That
package carries its own o200k vocabulary: loading it reads no file and opens no connection.
`HarmonyEncoder.load` checks it against the model directory's tokenizer before use, so a
directory whose tokenizer differs is refused at startup instead of rendering other ids.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import tokenizers

__all__ = ["HARMONY_MODEL_TYPES", "HarmonyEncoder", "token_bytes"]

#: `config.json` model types vLLM renders with Harmony.
HARMONY_MODEL_TYPES = frozenset({"gpt_oss"})

# Texts whose ids must agree between the package's vocabulary and the model's tokenizer.
_CHECK_TEXTS = (
    "Hello, world! It's 12:30 — don't panic; 1234567890 3.14159",
    "Да, конечно! 你好，世界。こんにちは 한국어 العربية हिन्दी 🌍🇫🇷👩‍👩‍👧",
    "def f(x):\n    return {'a': [1, 2, 3]}\t\r\n  spaces   end  ",
    "<|start|>assistant<|channel|>final<|message|>x<|end|><|call|><|return|><|constrain|>",
)


@dataclass(frozen=True)
class HarmonyEncoder:
    """The Harmony encoding, loaded once per model (the package's types stay in here)."""

    encoding: Any
    lib: Any

    @classmethod
    def load(cls, encode: Callable[[str], list[int]]) -> HarmonyEncoder:
        """Load the package's encoding; `encode` is the model tokenizer's (special tokens on)."""
        import openai_harmony

        encoding = openai_harmony.load_harmony_encoding(
            openai_harmony.HarmonyEncodingName.HARMONY_GPT_OSS
        )
        for text in _CHECK_TEXTS:
            if list(encoding.encode(text, allowed_special="all")) != encode(text):
                raise ValueError(
                    "the model's tokenizer does not match the Harmony encoding of gpt-oss"
                )
        return cls(encoding, openai_harmony)

    def encode(self, text: str) -> list[int]:
        return list(self.encoding.encode(text))

    def special(self, text: str) -> int:
        return int(self.encoding.encode(text, allowed_special="all")[0])


def token_bytes(backend: tokenizers.Tokenizer) -> tuple[bytes, ...]:
    """Each id's bytes for a byte-level BPE tokenizer (added tokens: their spelling)."""
    from render_service.model.fast_bpe import byte_decoder

    to_byte = {ord(ch): byte for ch, byte in byte_decoder().items()}
    size = backend.get_vocab_size(with_added_tokens=True)
    table = [b""] * size
    for text, token_id in backend.get_vocab(with_added_tokens=False).items():
        table[token_id] = text.translate(to_byte).encode("latin-1")
    for token_id, token in backend.get_added_tokens_decoder().items():
        if token_id < size:
            table[token_id] = token.content.encode()
    return tuple(table)
