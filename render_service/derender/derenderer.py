"""``Derenderer``: one model's derender path (chat and completions, batch and streaming).

Batch and streaming share one machine per choice (``machine.py``): detokenize a chunk, feed the
parser, turn its events into a delta. Batch derender is that machine fed the whole output as one
chunk. A stream carries the machine's state between calls as a small signed value
(``stream_state``), never the output history, so a chunk costs O(its own tokens).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import msgspec

from render_service.apis import messages as messages_api
from render_service.caches import ByteLRU
from render_service.derender import chat, completion, messages, responses
from render_service.derender.inputs import Check
from render_service.derender.machine import ChoiceMachine, Sealed, StreamFixed
from render_service.derender.parser_cache import ParserCache
from render_service.derender.seeds import Seeds
from render_service.derender.stream_state import VERSION, StateCodec, random_secret
from render_service.derender.streams import (
    STREAM_KINDS,
    CachedState,
    StreamStates,
    VllmStateBounds,
)
from render_service.model.loading import Model
from render_service.model.parser_setup import ParsingSetup
from render_service.protocol.chat import ChatCompletionRequest, ChatCompletionResponse
from render_service.protocol.completions import CompletionResponse
from render_service.protocol.derender import (
    ChatDerenderChunk,
    ChatDerenderChunks,
    ChatDerenderStreams,
    CompletionDerenderChunk,
    DerenderChatRequest,
    DerenderChatStreamRequest,
    DerenderChatStreamsRequest,
    DerenderChatStreamWire,
    DerenderCompletionRequest,
    DerenderCompletionStreamRequest,
    DerenderMessagesRequest,
    DerenderMessagesStreamRequest,
    DerenderResponsesRequest,
    DerenderResponsesStreamRequest,
)
from render_service.protocol.messages import MessagesDerenderEvents, MessagesResponse
from render_service.protocol.responses import ResponsesDerenderEvents, ResponsesResponse
from render_service.settings import Settings

# vLLM's state holds, per output id, the id, its token string and its chunk length in JSON:
# 32 bytes an id covers every tokenizer we serve (measured: ~20 on average for Qwen3).
_VLLM_STATE_BYTES_PER_ID = 32


class Derenderer:
    """Derenders outputs of one model, with the server's parser flags, cache and state codec."""

    def __init__(
        self,
        model: Model,
        parsing: ParsingSetup | None,
        settings: Settings,
        codecs: Mapping[str, StateCodec],
        cache: ParserCache[CachedState],
        secret: bytes,
    ) -> None:
        self.model = model
        self.settings = settings
        self.machine = ChoiceMachine(
            model,
            parsing,
            settings.max_logprobs,
            settings.max_n_sequences,
            settings.small_cache_bytes,
        )
        max_len = model.info.max_model_len
        bounds = VllmStateBounds(
            max_bytes=settings.max_vllm_stream_state_bytes or _VLLM_STATE_BYTES_PER_ID * max_len,
            max_ids=max_len,
        )
        constants: ByteLRU[str, tuple[Sealed, StreamFixed]] = ByteLRU(
            "stream_constants", settings.stream_constants_cache_bytes
        )
        self.streams = StreamStates(self.machine, codecs, cache, bounds, constants)
        self.template_probes = messages_api.TemplateProbes(model, settings)
        self.seeds = Seeds(self.machine, settings, secret)

    @property
    def model_name(self) -> str:
        return self.model.info.served_model_name

    @property
    def cache(self) -> ParserCache[CachedState]:
        return self.streams.cache

    def derender_chat(self, body: DerenderChatRequest) -> ChatCompletionResponse:
        """Non-streaming chat derender: vLLM's ChatCompletionResponse."""
        return chat.derender_chat(self, body)

    def derender_chat_stream(
        self,
        body: DerenderChatStreamRequest | DerenderChatStreamWire,
        check: Check | None = None,
        kind: str = "chat",
    ) -> ChatDerenderChunk | ChatDerenderChunks:
        """One chat chunk (or one per ``generate_chunks`` item) and the next ``stream_state``.

        ``check``: the server's checks of an embedded chat request (the HTTP layer's limits).
        ``kind``: the endpoint whose stream this is (an API built on the chat machine passes
        its own, so its states continue only there).
        """
        return chat.derender_chat_stream(self, body, check, kind)

    def derender_chat_streams(
        self,
        body: DerenderChatStreamsRequest | Sequence[DerenderChatStreamRequest],
        check: Check | None = None,
        *,
        msgpack: bool = False,
    ) -> ChatDerenderStreams:
        """One chunk for each of many streams (one engine step), each item answered on its own:
        its chunk and next state, or the error a single-stream call would have answered.

        ``body``: the HTTP body (``msgpack``: decoded from msgpack), or (in process)
        single-stream bodies, one per stream."""
        return chat.derender_chat_streams(self, body, check, msgpack)

    def derender_seed(
        self, request: ChatCompletionRequest | dict[str, Any], prompt_ids: list[int]
    ) -> str:
        """A signed seed that starts a stream of ``request`` rendered as ``prompt_ids``: pass it
        as a first derender call's ``derender_seed`` instead of its prompt and chat request."""
        return chat.derender_seed(self, request, prompt_ids)

    def derender_completion(self, body: DerenderCompletionRequest) -> CompletionResponse:
        """Non-streaming completions derender: vLLM's CompletionResponse."""
        return completion.derender_completion(self, body)

    def derender_completion_stream(
        self, body: DerenderCompletionStreamRequest
    ) -> CompletionDerenderChunk:
        """One completions chunk and the next ``stream_state``."""
        return completion.derender_completion_stream(self, body)

    def derender_messages(self, body: DerenderMessagesRequest) -> MessagesResponse:
        """Ours: a generate answer as an Anthropic Messages response."""
        return messages.derender_messages(self, body)

    def derender_messages_stream(
        self, body: DerenderMessagesStreamRequest
    ) -> MessagesDerenderEvents:
        """Ours: generate chunks as Messages stream events, and the next ``stream_state``."""
        return messages.derender_messages_stream(self, body)

    def derender_responses(self, body: DerenderResponsesRequest) -> ResponsesResponse:
        """Ours: a generate answer as an OpenAI Responses response."""
        return responses.derender_responses(self, body)

    def derender_responses_stream(
        self, body: DerenderResponsesStreamRequest
    ) -> ResponsesDerenderEvents:
        """Ours: generate chunks as Responses stream events, and the next ``stream_state``."""
        return responses.derender_responses_stream(self, body)


def build_derenderer(model: Model, parsing: ParsingSetup | None, settings: Settings) -> Derenderer:
    """A Derenderer with the server's state secret (or a per-process random one) and a fresh cache."""
    secret = settings.state_secret.encode() if settings.state_secret else random_secret()
    codecs = {
        kind: StateCodec(
            secret, state_context(model, settings, kind), settings.max_stream_state_bytes
        )
        for kind in STREAM_KINDS
    }
    cache: ParserCache[CachedState] = ParserCache(
        max_entries=settings.parser_cache_entries,
        ttl_seconds=settings.parser_cache_ttl,
        max_bytes=settings.parser_cache_bytes,
    )
    return Derenderer(model, parsing, settings, codecs, cache, secret)


def state_context(model: Model, settings: Settings, kind: str) -> bytes:
    """What a stream state is bound to: the model's identity (tokenizer, template, ...), the
    endpoint kind and every flag that changes how output is parsed."""
    return msgspec.json.encode(
        [
            VERSION,
            model.identity.hex(),
            kind,
            settings.reasoning_parser,
            settings.tool_call_parser,
            settings.enable_auto_tool_choice,
            settings.default_chat_template_kwargs,
            settings.reasoning_effort_map,
            settings.exclude_tools_when_tool_choice_none,
            settings.tool_strict_level,
        ]
    )
