"""The stream_state envelope: round trips, and every way a token can be altered is a 400."""

from __future__ import annotations

import base64
import zlib

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from render_service.derender import stream_state
from render_service.derender.stream_state import StateCodec, random_secret
from render_service.errors import StreamStateError

SECRET = b"s" * 32
CONTEXT = b"model=qwen3;reasoning=qwen3;tools=hermes"
B64URL = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"


class Sample(msgspec.Struct, frozen=True):
    """Shaped like a parser + detokenizer state: a few ints, a short id window, a held-back tail."""

    phase: int
    offset: int
    tool_index: int
    read_offset: int
    window: tuple[int, ...]
    held: str


class Other(msgspec.Struct, frozen=True):
    name: str


SAMPLE = Sample(2, 1234, 1, 1230, tuple(range(151640, 151650)), "<tool_")

samples = st.builds(
    Sample,
    st.integers(0, 2**31),
    st.integers(0, 2**31),
    st.integers(-1, 64),
    st.integers(0, 2**31),
    st.lists(st.integers(0, 2**20), max_size=12).map(tuple),
    st.text(max_size=40),
)


def codec(secret: bytes = SECRET, context: bytes = CONTEXT, max_bytes: int = 8192) -> StateCodec:
    return StateCodec(secret, context, max_bytes)


def raw_of(token: str) -> bytes:
    return base64.urlsafe_b64decode(token + "=" * (-len(token) % 4))


def token_of(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode("ascii")


def rejects(c: StateCodec, token: object, match: str | None = None) -> StreamStateError:
    with pytest.raises(StreamStateError, match=match) as info:
        c.decode(token, Sample)
    assert info.value.param == "stream_state"
    assert info.value.status == 400
    return info.value


@given(samples)
def test_round_trip(value: Sample) -> None:
    c = codec()
    token = c.encode(value)
    assert token.isascii()
    assert set(token) <= set(B64URL)
    assert c.decode(token, Sample) == value


def test_another_codec_with_same_secret_and_context_reads_it() -> None:
    """Any replica with the same secret and context continues the stream."""
    assert codec().decode(codec().encode(SAMPLE), Sample) == SAMPLE


def test_representative_state_is_small() -> None:
    token = codec().encode(SAMPLE)
    uncompressed = len(msgspec.msgpack.encode(SAMPLE))
    # version + flags + payload + 16-byte tag, base64: about 4/3 of the raw bytes.
    assert len(token) <= (2 + uncompressed + 16) * 4 // 3 + 1
    assert len(token) < 200


def test_deflate_used_only_when_it_helps() -> None:
    c = codec()
    big = msgspec.structs.replace(SAMPLE, held="ab" * 1000)
    token = c.encode(big)
    assert len(token) < len(msgspec.msgpack.encode(big))
    assert c.decode(token, Sample) == big
    noisy = msgspec.structs.replace(SAMPLE, held=token_of(random_secret() * 8))
    token = c.encode(noisy)
    assert len(raw_of(token)) <= 2 + len(msgspec.msgpack.encode(noisy)) + 16
    assert c.decode(token, Sample) == noisy


@given(st.data())
def test_any_flipped_byte_is_rejected(data: st.DataObject) -> None:
    c = codec()
    raw = bytearray(raw_of(c.encode(SAMPLE)))
    pos = data.draw(st.integers(0, len(raw) - 1), label="position")
    raw[pos] ^= data.draw(st.integers(1, 255), label="xor")
    rejects(c, token_of(bytes(raw)))


@given(st.data())
def test_any_changed_character_is_rejected(data: st.DataObject) -> None:
    """Including changes that only touch the spare low bits of the last character."""
    c = codec()
    token = c.encode(SAMPLE)
    pos = data.draw(st.integers(0, len(token) - 1), label="position")
    char = data.draw(st.sampled_from(B64URL).filter(lambda ch: ch != token[pos]), label="char")
    rejects(c, token[:pos] + char + token[pos + 1 :])


def test_every_truncation_is_rejected() -> None:
    c = codec()
    for value in (SAMPLE, msgspec.structs.replace(SAMPLE, held="ab" * 500)):
        token = c.encode(value)
        for n in range(len(token)):
            rejects(c, token[:n])


def test_appended_bytes_are_rejected() -> None:
    c = codec()
    raw = raw_of(c.encode(SAMPLE))
    for extra in (b"\x00", b"\x00" * 16, raw[-16:]):
        rejects(c, token_of(raw + extra))


def test_other_secret_is_rejected() -> None:
    token = codec(secret=b"t" * 32).encode(SAMPLE)
    rejects(codec(), token, "verification")


def test_other_context_is_rejected() -> None:
    token = codec(context=CONTEXT + b";tool_choice=auto").encode(SAMPLE)
    rejects(codec(), token, "verification")


def test_other_version_is_rejected(monkeypatch: pytest.MonkeyPatch) -> None:
    c = codec()
    monkeypatch.setattr(stream_state, "VERSION", stream_state.VERSION + 1)
    token = c.encode(SAMPLE)
    monkeypatch.undo()
    rejects(c, token, f"version {stream_state.VERSION + 1}")


def test_oversize_is_rejected_before_any_other_check() -> None:
    c = codec(max_bytes=256)
    # Not base64 and not signed: only the size check can have produced a size message.
    err = rejects(c, "!" * 257, "limit")
    assert "257" in str(err)
    rejects(c, "!" * 256, "base64")


def test_encode_refuses_a_state_over_the_limit() -> None:
    c = codec(max_bytes=256)
    noisy = msgspec.structs.replace(SAMPLE, held=token_of(random_secret() * 8))
    with pytest.raises(StreamStateError, match="limit"):
        c.encode(noisy)


@pytest.mark.parametrize("token", [{}, {"a": 1}, [], ["x"], 0, 17, None, 1.5, b"abc", True])
def test_non_string_is_rejected(token: object) -> None:
    rejects(codec(), token, "must be a string")


@pytest.mark.parametrize(
    "token",
    ["", "A", "AAAAA", "!" * 40, "A" * 39 + "=", "A" * 38 + "==", "A" * 38 + "+/", " " + "A" * 39],
)
def test_bad_base64_or_too_short_is_rejected(token: str) -> None:
    rejects(codec(), token)


def test_non_ascii_is_rejected() -> None:
    token = codec().encode(SAMPLE)
    rejects(codec(), token[:-1] + "é", "base64")


def test_wrong_type_is_rejected() -> None:
    c = codec()
    rejects(c, c.encode(Other("x")), "server can read")


def test_decoders_are_built_once_per_type() -> None:
    c = codec()
    c.decode(c.encode(SAMPLE), Sample)
    first = stream_state._DECODERS[Sample]
    c.decode(c.encode(SAMPLE), Sample)
    assert stream_state._DECODERS[Sample] is first


def test_constructor_checks() -> None:
    with pytest.raises(ValueError, match="secret"):
        StateCodec(b"", CONTEXT)
    with pytest.raises(ValueError, match="max_bytes"):
        StateCodec(SECRET, CONTEXT, max_bytes=8)


def test_random_secret() -> None:
    a, b = random_secret(), random_secret()
    assert len(a) == 32
    assert a != b
    rejects(codec(secret=a), codec(secret=b).encode(SAMPLE), "verification")


def signed(c: StateCodec, body: bytes) -> str:
    """A token our own key signed around ``body``: stands in for a state from a future build."""
    return token_of(body + c._tag(body))


def test_signed_but_malformed_payloads_are_rejected() -> None:
    c = codec(max_bytes=256)
    version = bytes((stream_state.VERSION,))
    payload = msgspec.msgpack.encode(SAMPLE)
    assert c.decode(signed(c, version + b"\x00" + payload), Sample) == SAMPLE
    rejects(c, signed(c, version + b"\x02" + payload), "flags")
    rejects(c, signed(c, version + b"\x01" + payload), "corrupt")
    deflate = zlib.compressobj(9, zlib.DEFLATED, -15)
    truncated = deflate.compress(payload) + deflate.flush()
    rejects(c, signed(c, version + b"\x01" + truncated[:-2]), "corrupt")
    rejects(c, signed(c, version + b"\x01" + truncated + b"\x00"), "corrupt")
    deflate = zlib.compressobj(9, zlib.DEFLATED, -15)
    bomb = deflate.compress(b"\x00" * (256 * 64)) + deflate.flush()
    rejects(c, signed(c, version + b"\x01" + bomb), "too large")
