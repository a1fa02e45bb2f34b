"""A streaming call's prompt ids and chat request, decoded only when a call needs them.

vLLM's client loop sends the whole prompt and chat request with every chunk (~14 KB for a 1k
prompt with tools), while only a stream's first call reads them: later calls continue the
state, which already holds what the parser needs. So the HTTP layer hands both over as raw JSON;
the first call decodes and validates them and its state keeps a digest of their bytes, and a
later call that sends the same bytes again skips decoding, validating and checking them. Bytes
that differ are decoded and validated as on a first call (the state still decides the parse).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from typing import Any, Final

import msgspec

from render_service.protocol.chat import ChatCompletionRequest
from render_service.protocol.derender import RawField, TokenId
from render_service.validation import convert, decode_field

__all__ = ["INPUTS_DIGEST_SIZE", "NO_INPUTS", "Check", "StreamInputs", "no_check"]

#: Bytes of the inputs' digest a stream state keeps. A match only lets a call skip validating
#: bytes it then ignores (the state decides the parse), so a forged match gains nothing; 8 bytes
#: make an accidental one negligible at 12 bytes a chunk on the wire.
INPUTS_DIGEST_SIZE: Final = 8
# Typed as the body's fields are, so a bad value gets the message a whole-body decode gives;
# (JSON, msgpack) pairs, as the body came.
_PROMPT_DECODERS: Final = (
    msgspec.json.Decoder(list[TokenId] | None),
    msgspec.msgpack.Decoder(list[TokenId] | None),
)
_OBJECT_DECODERS: Final = (
    msgspec.json.Decoder(dict[str, Any] | None),
    msgspec.msgpack.Decoder(dict[str, Any] | None),
)
# A null field: JSON's null or msgpack's nil (as msgpack, b"null" is never one whole value).
_NULLS: Final = frozenset((b"null", b"\xc0"))

# A server's checks of an embedded chat request (its limits), run wherever one is decoded.
Check = Callable[[dict[str, Any]], None]


def no_check(request: dict[str, Any]) -> None:
    """The library applies no server limits."""


class StreamInputs:
    """``prompt_token_ids`` and ``chat_request`` of one streaming call, as values or raw JSON.

    ``digest`` is empty when the call sent neither (a lean call) or sent values rather than JSON
    (the library: nothing to gain from hashing what is already decoded).
    """

    __slots__ = (
        "_chat",
        "_chat_raw",
        "_check",
        "_decoded",
        "_format",
        "_prompt",
        "_prompt_raw",
        "digest",
    )

    def __init__(
        self,
        prompt_ids: list[int] | None = None,
        chat_request: dict[str, Any] | None = None,
    ) -> None:
        self._prompt = prompt_ids
        self._chat = chat_request
        self._prompt_raw = self._chat_raw = b""
        self._check: Check = no_check
        self._decoded: ChatCompletionRequest | None = None
        self._format = 0
        self.digest = b""

    @classmethod
    def of_raw(
        cls,
        prompt_ids: RawField,
        chat_request: RawField,
        check: Check = no_check,
        *,
        msgpack: bool = False,
    ) -> StreamInputs:
        """Inputs as the body carried them (JSON, or msgpack); ``check`` runs on the chat
        request once it is decoded."""
        inputs = cls()
        prompt_raw, chat_raw = _present(prompt_ids), _present(chat_request)
        inputs._prompt_raw, inputs._chat_raw, inputs._check = prompt_raw, chat_raw, check
        inputs._format = int(msgpack)
        if prompt_raw or chat_raw:
            h = hashlib.sha256(len(prompt_raw).to_bytes(8, "little"))  # SHA-NI: ~1.6 GB/s
            h.update(prompt_raw)
            h.update(chat_raw)
            inputs.digest = h.digest()[:INPUTS_DIGEST_SIZE]
        return inputs

    @property
    def has_chat_request(self) -> bool:
        return self._chat is not None or bool(self._chat_raw)

    def prompt_ids(self) -> list[int] | None:
        """The prompt ids, decoded and validated on first use."""
        if self._prompt is None and self._prompt_raw:
            decoder = _PROMPT_DECODERS[self._format]
            self._prompt = decode_field(self._prompt_raw, decoder, "prompt_token_ids")
        return self._prompt

    def chat_request(self) -> ChatCompletionRequest | None:
        """The chat request, decoded, checked and validated on first use."""
        if self._decoded is not None:
            return self._decoded
        raw = self._chat
        if raw is None and self._chat_raw:
            raw = decode_field(self._chat_raw, _OBJECT_DECODERS[self._format], "chat_request")
            if raw is not None:
                self._check(raw)
        if raw is None:
            return None
        self._decoded = convert(raw, ChatCompletionRequest, "body.chat_request")
        return self._decoded

    def validate(self) -> None:
        """Decode and validate both, raising what a first call would raise for them."""
        self.prompt_ids()
        self.chat_request()


#: A lean call's inputs (neither sent): shared, since with nothing to decode none is ever stored.
NO_INPUTS: Final = StreamInputs()


def _present(raw: RawField) -> bytes:
    """The field's bytes, or none for a null or absent one."""
    data = bytes(raw) if isinstance(raw, msgspec.Raw) else b""
    return b"" if data in _NULLS else data
