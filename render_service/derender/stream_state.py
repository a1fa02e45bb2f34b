"""The ``stream_state`` envelope: a versioned, size-bounded, MAC-signed token for a Struct.

Wire layout, then base64url without padding::

    version (1 byte) | flags (1 byte) | msgpack payload, raw-deflated if flags & 1 | tag (16 bytes)

The tag is keyed BLAKE2b (BLAKE2's own MAC mode, RFC 7693; the keyed state is made once per
codec and copied for each tag) over the length of an optional *binding* (4 bytes), the binding,
then everything before the tag, keyed by a key derived (HMAC-SHA256) from the shared secret and the caller's
*context* (a fingerprint of model, parser config and derender-relevant flags), so a state issued
for another model, configuration or secret fails verification. The binding ties a token to
another one without carrying it: a stream's moving part is bound to the tag of its constant part
(``streams.py``), so parts of two streams cannot be mixed.

The tag is 128 bits: a forger must guess it online, one request per guess, and 2**-128 per guess
is far beyond reach, while each chunk saves 22 characters over a 256-bit tag.

The state is signed, not encrypted: a client can read it. It must never carry secrets.
"""

from __future__ import annotations

import base64
import binascii
import functools
import hashlib
import hmac
import secrets
import zlib
from typing import Any, Final, TypeVar

import msgspec

from render_service.errors import StreamStateError

__all__ = ["VERSION", "StateCodec", "check_token_version", "check_version", "random_secret"]

#: Bumped whenever a state written by one build cannot be read by another (2: a stream state is
#: a constant part signed once and a moving part bound to it, ``streams.py``; 3: the parser
#: states are msgpack arrays, not maps with their field names).
VERSION: Final = 3

_FLAG_DEFLATE: Final = 0x01
_HEADER: Final = 2
_TAG: Final = 16
# Raw deflate (no zlib header or checksum): the MAC already guards integrity. States are small, so
# a 4 KiB window and memLevel 4 compress as well as the defaults at a tenth of the setup cost;
# inflating with the largest window reads any window size.
_DEFLATE_WBITS: Final = -12
_DEFLATE_MEMLEVEL: Final = 4
_INFLATE_WBITS: Final = -15
# Below this many payload bytes deflate rarely wins, so it is not even tried.
_DEFLATE_MIN: Final = 768
# A verified payload inflates to at most this multiple of max_bytes (a bound on our own output).
_INFLATE_FACTOR: Final = 16
_KEY_LABEL: Final = b"render-service/stream_state\x00"
_PARAM: Final = "stream_state"

T = TypeVar("T")

# msgspec's Encoder is type-agnostic; decoders are built once per state type and reused.
_ENCODER: Final = msgspec.msgpack.Encoder()
_DECODERS: dict[type[Any], msgspec.msgpack.Decoder[Any]] = {}


def _decoder(type_: type[T]) -> msgspec.msgpack.Decoder[T]:
    dec = _DECODERS.get(type_)
    if dec is None:
        # A race here only builds the same decoder twice.
        dec = _DECODERS.setdefault(type_, msgspec.msgpack.Decoder(type_))
    return dec


def _fail(message: str) -> StreamStateError:
    return StreamStateError(message, _PARAM)


def random_secret() -> bytes:
    """A fresh 32-byte secret for a process run without one: its states verify only there."""
    return secrets.token_bytes(32)


class StateCodec:
    """Encodes Structs into signed ``stream_state`` tokens and verifies them back.

    ``secret`` is shared by every replica that may continue a stream (use 32 random bytes);
    ``context`` fingerprints what makes a state meaningful; ``max_bytes`` bounds the token length,
    checked before any other work on decode. Thread-safe: it is never mutated after construction.
    """

    __slots__ = ("_deflate_min", "_key", "_mac", "_max_payload", "max_bytes")

    def __init__(
        self, secret: bytes, context: bytes, max_bytes: int = 8192, deflate_min: int = _DEFLATE_MIN
    ) -> None:
        if not secret:
            raise ValueError("the stream_state secret must not be empty")
        if max_bytes < _HEADER + _TAG + 8:
            raise ValueError(f"max_bytes={max_bytes} is too small for a stream_state")
        self._key = hmac.digest(secret, _KEY_LABEL + context, "sha256")
        # Keyed once: each tag copies this state instead of absorbing the key block again.
        self._mac = hashlib.blake2b(key=self._key, digest_size=_TAG)
        self._max_payload = max_bytes * _INFLATE_FACTOR
        self._deflate_min = deflate_min
        self.max_bytes = max_bytes

    def derive(self, label: bytes, deflate_min: int = _DEFLATE_MIN) -> StateCodec:
        """A codec whose tokens this one refuses, and the reverse (keyed by ``label`` too).

        ``deflate_min``: payloads from this many bytes are deflated where that makes them
        shorter (a token signed once and sent with every chunk gains from it even when small).
        """
        return StateCodec(self._key, label, self.max_bytes, deflate_min)

    def encode(self, value: msgspec.Struct, binding: bytes = b"") -> str:
        """The signed token for ``value``; StreamStateError if it would exceed ``max_bytes``."""
        return self.seal(value, binding)[0]

    def seal(self, value: msgspec.Struct, binding: bytes = b"") -> tuple[str, bytes]:
        """The signed token for ``value`` (bound to ``binding``) and its tag."""
        payload = _ENCODER.encode(value)
        if len(payload) > self._max_payload:
            raise _fail(f"stream state is {len(payload)} bytes, over the limit of this server")
        flags = 0
        if len(payload) >= self._deflate_min:
            deflater = zlib.compressobj(6, zlib.DEFLATED, _DEFLATE_WBITS, _DEFLATE_MEMLEVEL)
            packed = deflater.compress(payload) + deflater.flush()
            if len(packed) < len(payload):
                payload, flags = packed, _FLAG_DEFLATE
        body = bytes((VERSION, flags)) + payload
        tag = self._tag(body, binding)
        token = _b64encode(body + tag)
        if len(token) > self.max_bytes:
            raise _fail(
                f"stream state would be {len(token)} characters, over the limit of {self.max_bytes}"
            )
        return token, tag

    def decode(self, token: object, type_: type[T], binding: bytes = b"") -> T:
        """The value inside ``token``, verified; StreamStateError (400) for anything untrusted."""
        return self.open(token, type_, binding)[0]

    def open(self, token: object, type_: type[T], binding: bytes = b"") -> tuple[T, bytes]:
        """The value inside ``token`` (signed bound to ``binding``), verified, and its tag."""
        if not isinstance(token, str):
            raise _fail(f"stream_state must be a string, not {type(token).__name__}")
        if len(token) > self.max_bytes:
            raise _fail(f"stream_state is {len(token)} characters; the limit is {self.max_bytes}")
        raw = _b64decode(token)
        if len(raw) < _HEADER + _TAG:
            raise _fail("stream_state is truncated")
        check_version(raw[0])
        body, tag = raw[:-_TAG], raw[-_TAG:]
        if not hmac.compare_digest(self._tag(body, binding), tag):
            raise _fail(
                "stream_state failed verification: it was altered or truncated, or was issued "
                "for another model, configuration or secret"
            )
        payload = self._unpack(body[1], body[_HEADER:])
        try:
            return _decoder(type_).decode(payload), tag
        except msgspec.DecodeError as exc:
            raise _fail("stream_state does not hold a state this server can read") from exc

    def _tag(self, body: bytes, binding: bytes = b"") -> bytes:
        mac = self._mac.copy()
        mac.update(len(binding).to_bytes(4, "little") + binding + body)
        return mac.digest()

    def _unpack(self, flags: int, payload: bytes) -> bytes:
        if flags == 0:
            return payload
        if flags != _FLAG_DEFLATE:
            raise _fail(f"stream_state has unknown flags {flags:#04x}")
        inflater = zlib.decompressobj(_INFLATE_WBITS)
        try:
            out = inflater.decompress(payload, self._max_payload)
        except zlib.error as exc:
            raise _fail("stream_state payload is corrupt") from exc
        if inflater.unconsumed_tail or inflater.unused_data or not inflater.eof:
            raise _fail("stream_state payload is corrupt or too large")
        return out


def check_version(version: int) -> None:
    """StreamStateError unless ``version`` (a token's first byte) is the one this build reads."""
    if version != VERSION:
        raise _fail(
            f"stream_state has version {version}, which this server does not support "
            f"(it reads version {VERSION}); restart the stream"
        )


def check_token_version(token: str) -> None:
    """StreamStateError if ``token`` starts like a token of another version: a cheap look at its
    first characters, before the parts of a stream state are split and verified."""
    if token.startswith(_version_prefix(VERSION)):
        return
    try:
        head = base64.urlsafe_b64decode(token[:4]) if len(token) >= 4 else b""
    except (binascii.Error, ValueError):
        return  # not base64url: verification refuses it
    if head:
        check_version(head[0])


@functools.cache
def _version_prefix(version: int) -> str:
    # The first two characters hold the version byte and the high bits of the flags (always 0).
    return base64.urlsafe_b64encode(bytes((version, 0, 0)))[:2].decode("ascii")


def _b64encode(data: bytes) -> str:
    """base64url without padding, in two native calls (base64's wrappers cost as much again)."""
    return binascii.b2a_base64(data, newline=False).translate(_URLSAFE).rstrip(b"=").decode("ascii")


_URLSAFE: Final = bytes.maketrans(b"+/", b"-_")


def _b64decode(token: str) -> bytes:
    """Strict base64url without padding: one spelling per byte string, or StreamStateError."""
    if not token.isascii() or len(token) % 4 == 1:
        raise _fail("stream_state is not valid base64url")
    try:
        raw = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4))
    except (binascii.Error, ValueError) as exc:
        raise _fail("stream_state is not valid base64url") from exc
    # The decoder skips foreign characters and ignores spare low bits; re-encoding catches both,
    # so any change to the token string is rejected rather than silently normalised.
    if _b64encode(raw) != token:
        raise _fail("stream_state is not valid base64url")
    return raw
