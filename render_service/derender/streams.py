"""Where a stream's state lives between calls: the parser cache first, else the signed
``stream_state`` the client sends back, else (a client switching over from vLLM) the output
history, replayed from the longest cached prefix."""

from __future__ import annotations

import hmac
from collections.abc import Callable
from typing import Any

import msgspec

from render_service.derender.machine import ChoiceMachine, ChoiceState
from render_service.derender.parser_cache import ParserCache
from render_service.derender.stream_state import StateCodec
from render_service.errors import InvalidRequest, SchemaError
from render_service.protocol.derender import GenerateChoice, GenerateChunk, VllmStreamState
from render_service.validation import convert

CachedState = tuple[str, ChoiceState]  # (the signed token we issued, its decoded state)


class StreamStates:
    """Loads and stores the states of one server's streams (thread-safe: the cache locks)."""

    def __init__(
        self, machine: ChoiceMachine, codec: StateCodec, cache: ParserCache[CachedState]
    ) -> None:
        self.machine = machine
        self.codec = codec
        self.cache = cache

    def load(self, raw: Any, chunk: GenerateChunk, fresh: Callable[[], ChoiceState]) -> ChoiceState:
        """The state a chunk continues: ``fresh()`` on a first call, else the one ``raw`` names."""
        if raw is None:
            return fresh()
        if isinstance(raw, dict):
            return self._resume_vllm_state(raw, fresh())
        state = self._decode(raw)
        check_same_stream(state, chunk)
        return state

    def store(self, state: ChoiceState, finished: bool) -> str:
        """The token for the client's next call; unfinished streams stay in the cache too."""
        signed = self.codec.encode(state)
        if not finished:
            self.cache.check_in(state.digest, (signed, state))
        return f"{state.digest.hex()}.{signed}"

    def _decode(self, token: Any) -> ChoiceState:
        """A hit on the exact token we issued skips verifying and decoding it."""
        if isinstance(token, str):
            digest_hex, dot, signed = token.partition(".")
            if dot and len(digest_hex) == 32:
                digest = _digest_of(digest_hex)
                cached = self.cache.check_out(digest) if digest is not None else None
                if cached is not None and hmac.compare_digest(
                    cached[0].encode(), signed.encode(errors="replace")
                ):
                    return cached[1]
                token = signed
        return self.codec.decode(token, ChoiceState)

    def _resume_vllm_state(self, raw: dict[str, Any], fresh: ChoiceState) -> ChoiceState:
        """A client carrying vLLM's state (all output ids so far): resume from the longest cached
        prefix of that history, replaying only what is left (all of it on a miss)."""
        vllm_state = convert(raw, VllmStreamState, "body.stream_state")
        history = vllm_state.output_token_ids
        if sum(vllm_state.output_chunk_lens) != len(history):
            raise SchemaError(
                "1 validation error:\n  {'loc': 'body.stream_state', 'msg': 'Value error, "
                "output_chunk_lens must sum to len(output_token_ids)'}",
                "body.stream_state",
            )
        state = fresh
        done = 0
        found = self.cache.longest_prefix(fresh.digest, history)
        if found is not None:
            done, (_, state) = found
        if done < len(history):
            rest = GenerateChoice(
                index=fresh.index, finish_reason=None, token_ids=list(history[done:])
            )
            parser = self.machine.parser(state.parse_request)
            state = self.machine.step(state, rest, parser, finished=False).state
        return msgspec.structs.replace(
            state,
            role_sent=vllm_state.role_sent,
            logprob_context=tuple(vllm_state.logprob_context_token_ids),
            text_offset=vllm_state.logprob_text_offset,
        )


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
