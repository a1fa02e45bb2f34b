"""Where a stream's state lives between calls: the parser cache first, else the signed
``stream_state`` the client sends back, else (a client switching over from vLLM) the output
history, replayed from the longest cached prefix.

A token is ``<digest>.<constant part>.<moving part>``. The constant part (``StreamFixed``: the
request and choice, the options, the parse context) is signed once, at the stream's first call,
and travels unchanged; each replica caches what it verified, keyed by the signed bytes (MAC
included), so a later chunk neither re-verifies nor re-signs it. The moving part (parser and
detokenizer state, offsets) is small and signed each chunk, bound to the constant part's tag, so
parts of two streams or two calls cannot be mixed. The ``<digest>`` prefix only names the
stream's entry in the parser cache. The token stays self-contained: a replica that has cached
neither part verifies both and continues the stream.
"""

from __future__ import annotations

import hmac
from collections.abc import Callable, Mapping
from typing import Any

import msgspec

from render_service.abandon import check_abandoned
from render_service.caches import ByteLRU
from render_service.derender.machine import (
    ChoiceMachine,
    ChoiceState,
    Sealed,
    StreamFixed,
    StreamMoving,
)
from render_service.derender.parser_cache import ParserCache
from render_service.derender.stream_state import StateCodec, check_token_version
from render_service.errors import InvalidRequest, SchemaError, StreamStateError
from render_service.protocol.derender import GenerateChoice, GenerateChunk, VllmStreamState
from render_service.validation import convert

_PARAM = "stream_state"
# Ids replayed between two looks at whether the request was abandoned.
_REPLAY_SLICE = 512
_ENCODER = msgspec.json.Encoder()
_LIST_FIELDS = ("output_token_ids", "output_chunk_lens", "prev_tokens", "last_tool_call_ids")

#: The endpoints a stream state can be issued for; a state continues only its own kind.
STREAM_KINDS = ("chat", "completions", "messages", "responses")
# (the kind, the signed moving part we issued, its decoded state)
CachedState = tuple[str, str, ChoiceState]
#: A parser-cache entry waiting to be checked in: (key, value, estimated bytes).
CheckIn = tuple[bytes, CachedState, int]
# The constant parts are signed with a key of their own, so neither part passes for the other.
_FIXED_LABEL = b"render-service/stream_state/fixed"
_HINT_CHARS = 32


class StreamStates:
    """Loads and stores the states of one server's streams (thread-safe: the cache locks).

    ``codecs`` has one codec per stream kind (``STREAM_KINDS``), each keyed for that kind, so a
    state issued by one endpoint fails verification at another.
    """

    def __init__(
        self,
        machine: ChoiceMachine,
        codecs: Mapping[str, StateCodec],
        cache: ParserCache[CachedState],
        vllm_bounds: VllmStateBounds,
        constants: ByteLRU[str, tuple[Sealed, StreamFixed]] | None = None,
    ) -> None:
        self.machine = machine
        self.codecs = codecs
        # Deflated whenever shorter: signed once, the constant part then rides on every chunk
        # both ways (3 tools: 628 payload bytes deflate to 320, a token of 450 characters not 862).
        self.fixed_codecs = {
            kind: codec.derive(_FIXED_LABEL, deflate_min=0) for kind, codec in codecs.items()
        }
        self.cache = cache
        self.vllm_bounds = vllm_bounds
        #: Constant parts verified here, by their signed token (one per live stream).
        self.constants = constants if constants is not None else ByteLRU("stream_constants", 0)

    @property
    def codec(self) -> StateCodec:
        """The chat endpoint's codec."""
        return self.codecs["chat"]

    def load(
        self,
        raw: Any,
        chunk: GenerateChunk,
        fresh: Callable[[], ChoiceState],
        kind: str = "chat",
    ) -> ChoiceState:
        """The state a chunk continues: ``fresh()`` on a first call, else the one ``raw`` names."""
        if raw is None:
            return fresh()
        if isinstance(raw, dict):
            return self._resume_vllm_state(raw, fresh)
        state = self._decode(raw, kind)
        check_same_stream(state, chunk)
        return state

    def store(
        self,
        state: ChoiceState,
        finished: bool,
        kind: str = "chat",
        check_ins: list[CheckIn] | None = None,
    ) -> str:
        """The token for the client's next call; unfinished streams stay in the cache too
        (checked in now, or added to ``check_ins`` for the caller's ``check_in``).

        The constant part is signed on the stream's first store only; each store signs the
        moving part, bound to it."""
        sealed = state.sealed
        if sealed is None or sealed.kind != kind:
            sealed = self._seal(state.fixed, kind)
            state = msgspec.structs.replace(state, sealed=sealed)
        codec = self.codecs[kind]
        moving = codec.encode(state.moving(), sealed.tag)
        size = len(sealed.token) + 1 + len(moving)
        if size > codec.max_bytes:
            raise StreamStateError(
                f"stream state would be {size} characters, over the limit of {codec.max_bytes}",
                _PARAM,
            )
        if not finished:
            entry: CheckIn = (state.digest, (kind, moving, state), entry_bytes(size))
            if check_ins is None:
                self.cache.check_in(*entry)
            else:
                check_ins.append(entry)
        return f"{state.digest.hex()}.{sealed.token}.{moving}"

    def check_in(self, entries: list[CheckIn]) -> None:
        """Check in the entries of several ``store`` calls at once (one lock for all)."""
        if entries:
            self.cache.check_in_many(entries)

    def _seal(self, fixed: StreamFixed, kind: str) -> Sealed:
        token, tag = self.fixed_codecs[kind].seal(fixed)
        sealed = Sealed(kind, token, tag, self.machine.parser_key(fixed.parse_request))
        self.constants.put(token, (sealed, fixed), entry_bytes(len(token)))
        return sealed

    def _decode(self, token: Any, kind: str) -> ChoiceState:
        """``[<digest>.]<constant part>.<moving part>``, verified. A hit on the exact token we
        issued for this kind skips verifying and decoding it; a constant part verified here
        before is not verified again."""
        codec = self.codecs[kind]
        if not isinstance(token, str):
            raise StreamStateError(
                f"stream_state must be a string, not {type(token).__name__}", _PARAM
            )
        if len(token) > codec.max_bytes + _HINT_CHARS + 1:
            raise StreamStateError(
                f"stream_state is {len(token)} characters; the limit is {codec.max_bytes}", _PARAM
            )
        parts = token.split(".")
        if len(parts) == 3:
            digest = _digest_of(parts[0])
            cached = self.cache.check_out(digest) if digest is not None else None
            if (
                cached is not None
                and cached[0] == kind
                and hmac.compare_digest(cached[1], parts[2])
                and cached[2].sealed is not None
                and hmac.compare_digest(cached[2].sealed.token, parts[1])
            ):
                return cached[2]  # the token we issued: this build's version
            parts = parts[1:]
        # An older build's token (one signed part after the hint) fails on its version first.
        check_token_version(parts[-1])
        if len(parts) != 2:
            raise StreamStateError(
                "stream_state failed verification: it is not a state this server issued (it has "
                "no constant and moving part)",
                _PARAM,
            )
        fixed_token, moving_token = parts
        sealed, fixed = self._open_fixed(fixed_token, kind)
        moving = codec.decode(moving_token, StreamMoving, sealed.tag)
        return ChoiceState.join(sealed, fixed, moving)

    def _open_fixed(self, token: str, kind: str) -> tuple[Sealed, StreamFixed]:
        """A constant part verified here before, else verified now and kept."""
        known = self.constants.get(token)
        if known is not None and known[0].kind == kind:
            return known
        fixed, tag = self.fixed_codecs[kind].open(token, StreamFixed)
        sealed = Sealed(kind, token, tag, self.machine.parser_key(fixed.parse_request))
        self.constants.put(token, (sealed, fixed), entry_bytes(len(token)))
        return sealed, fixed

    def _resume_vllm_state(
        self, raw: dict[str, Any], fresh: Callable[[], ChoiceState]
    ) -> ChoiceState:
        """A client carrying vLLM's state (all output ids so far): resume from the longest cached
        prefix of that history, replaying only what is left (all of it on a miss).

        Every field is bounded before any work; the replay runs in slices and stops when the
        request is abandoned.
        """
        vllm_state = self.vllm_bounds.read(raw)
        history = vllm_state.output_token_ids
        start = fresh()
        state = start
        done = 0
        found = self.cache.longest_prefix(start.digest, history)
        if found is not None:
            done, (_, _, state) = found
        parser = self.machine.parser(state.parse_request, state.parser_key)
        for offset in range(done, len(history), _REPLAY_SLICE):
            check_abandoned()
            rest = GenerateChoice(
                index=start.index,
                finish_reason=None,
                token_ids=list(history[offset : offset + _REPLAY_SLICE]),
            )
            state = self.machine.step(state, rest, parser, finished=False).state
        return msgspec.structs.replace(
            state,
            role_sent=vllm_state.role_sent,
            logprob_context=tuple(vllm_state.logprob_context_token_ids),
            text_offset=vllm_state.logprob_text_offset,
        )


class VllmStateBounds(msgspec.Struct, frozen=True):
    """How large an accepted vLLM-format state may be: its JSON size and its lists (each at most
    the model's context: a stream never holds more), all checked before it is used."""

    max_bytes: int
    max_ids: int

    def read(self, raw: dict[str, Any]) -> VllmStreamState:
        """The state, or a 400 naming what is over its bound."""
        for name in _LIST_FIELDS:  # O(1) each, before anything walks the lists
            value = raw.get(name)
            if isinstance(value, list) and len(value) > self.max_ids:
                raise StreamStateError(
                    f"stream_state.{name} has {len(value)} items, more than max_model_len "
                    f"({self.max_ids})",
                    _PARAM,
                )
        # The body was decoded within --max-body-bytes; encoding is a fast bound on the rest.
        size = len(_ENCODER.encode(raw))
        if size > self.max_bytes:
            raise StreamStateError(
                f"stream_state is {size} bytes of JSON; this server's limit is {self.max_bytes} "
                "(--max-vllm-stream-state-bytes)",
                _PARAM,
            )
        state = convert(raw, VllmStreamState, "body.stream_state")
        if sum(state.output_chunk_lens) != len(state.output_token_ids):
            raise SchemaError(
                "1 validation error:\n  {'loc': 'body.stream_state', 'msg': 'Value error, "
                "output_chunk_lens must sum to len(output_token_ids)'}",
                "body.stream_state",
            )
        return state


def entry_bytes(chars: int) -> int:
    """A cached state's (or constant part's) memory, estimated from its token's length: the
    token and the decoded value take about 21 bytes of Python objects per token character
    (measured on Qwen3 hermes tool-call states with a recursive sys.getsizeof), rounded up, plus
    fixed overhead (key, tuple)."""
    return 24 * chars + 1024


def check_same_stream(state: ChoiceState, chunk: GenerateChunk) -> None:
    """A state continues only the stream (generate request and choice) it was made for."""
    fixed = state.fixed
    if fixed.request_id != chunk.request_id or fixed.index != chunk.choices[0].index:
        raise InvalidRequest(
            "stream_state belongs to another stream (request id or choice index differ)",
            "stream_state",
        )


def _digest_of(token_prefix: str) -> bytes | None:
    try:
        return bytes.fromhex(token_prefix)
    except ValueError:
        return None
