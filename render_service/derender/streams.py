"""Where a stream's state lives between calls: the parser cache first, else the signed
``stream_state`` the client sends back, else (a client switching over from vLLM) the output
history, replayed from the longest cached prefix."""

from __future__ import annotations

import hmac
from collections.abc import Callable, Mapping
from typing import Any

import msgspec

from render_service.abandon import check_abandoned
from render_service.derender.machine import ChoiceMachine, ChoiceState
from render_service.derender.parser_cache import ParserCache
from render_service.derender.stream_state import StateCodec
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
# (the kind, the signed token we issued, its decoded state)
CachedState = tuple[str, str, ChoiceState]


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
    ) -> None:
        self.machine = machine
        self.codecs = codecs
        self.cache = cache
        self.vllm_bounds = vllm_bounds

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

    def store(self, state: ChoiceState, finished: bool, kind: str = "chat") -> str:
        """The token for the client's next call; unfinished streams stay in the cache too."""
        signed = self.codecs[kind].encode(state)
        if not finished:
            self.cache.check_in(state.digest, (kind, signed, state), entry_bytes(signed))
        return f"{state.digest.hex()}.{signed}"

    def _decode(self, token: Any, kind: str) -> ChoiceState:
        """A hit on the exact token we issued for this kind skips verifying and decoding it."""
        if isinstance(token, str):
            digest_hex, dot, signed = token.partition(".")
            if dot and len(digest_hex) == 32:
                digest = _digest_of(digest_hex)
                cached = self.cache.check_out(digest) if digest is not None else None
                if (
                    cached is not None
                    and cached[0] == kind
                    and hmac.compare_digest(cached[1].encode(), signed.encode(errors="replace"))
                ):
                    return cached[2]
                token = signed
        return self.codecs[kind].decode(token, ChoiceState)

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
        parser = self.machine.parser(state.parse_request)
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


def entry_bytes(signed: str) -> int:
    """A cached state's memory, estimated from its token: the token and the decoded state take
    about 21 bytes of Python objects per token character (measured on Qwen3 hermes tool-call
    states with a recursive sys.getsizeof), rounded up, plus fixed overhead (key, tuple)."""
    return 24 * len(signed) + 1024


def check_same_stream(state: ChoiceState, chunk: GenerateChunk) -> None:
    """A state continues only the stream (generate request and choice) it was made for."""
    choice = chunk.choices[0]
    if state.request_id != chunk.request_id or state.index != choice.index:
        raise InvalidRequest(
            "stream_state belongs to another stream (request id or choice index differ)",
            "stream_state",
        )


def _digest_of(token_prefix: str) -> bytes | None:
    try:
        return bytes.fromhex(token_prefix)
    except ValueError:
        return None
