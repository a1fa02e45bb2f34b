"""What parsers need to know about a model's tokenizer, as plain data."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import msgspec

from parsers.errors import UnsupportedModelError

__all__ = ["TokenizerFacts"]


class TokenizerFacts(msgspec.Struct, frozen=True):
    """Added and special tokens of one model; built once per model, shared by all requests."""

    added_tokens: dict[str, int]
    special_ids: frozenset[int]
    #: Each id's bytes (special tokens: their spelling), for families that read output as bytes
    #: (Harmony); empty unless the model needs it.
    token_bytes: tuple[bytes, ...] = ()

    @classmethod
    def from_added_tokens(
        cls,
        added_tokens: Mapping[str, int],
        special_ids: Iterable[int] = (),
        token_bytes: tuple[bytes, ...] = (),
    ) -> TokenizerFacts:
        """Build from `{text: id}` of the added tokens and the ids flagged special."""
        return cls(
            added_tokens=dict(added_tokens),
            special_ids=frozenset(special_ids),
            token_bytes=token_bytes,
        )

    def marker_id(self, text: str, family: str) -> int:
        """Id of the added token spelled `text`; the family cannot run without it."""
        token_id = self.added_tokens.get(text)
        if token_id is None:
            raise UnsupportedModelError(
                f"parser {family!r} needs the token {text!r}, which this tokenizer does not have"
            )
        return token_id

    def optional_id(self, text: str) -> int | None:
        """Id of the added token spelled `text`, or None."""
        return self.added_tokens.get(text)
