"""What Messages and Responses streams share: they ride on the chat stream machine.

``stream_state`` is the chat stream state plus the API machine's own state, signed together:
``<chat state>~<api state>``; the API state carries a digest of the chat state it was issued with,
so parts of two calls or two streams cannot be mixed.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Generic, TypeVar

import msgspec

from render_service.derender.stream_state import StateCodec
from render_service.errors import StreamStateError
from render_service.protocol.chat import ChatCompletionStreamResponse
from render_service.protocol.derender import (
    ChatDerenderChunks,
    DerenderChatStreamRequest,
    DerenderMessagesStreamRequest,
    DerenderResponsesStreamRequest,
    GenerateChunk,
)

if TYPE_CHECKING:
    from render_service.derender.derenderer import Derenderer

_SEPARATOR = "~"
S = TypeVar("S", bound=msgspec.Struct)
MISSING_REQUEST = (
    "{field} is required on the first call of a stream (and on a batch derender) when a tool "
    "or reasoning parser is configured."
)


def prompt_tokens(given: int | None, ids: Sequence[int] | None) -> int:
    return given if given is not None else len(ids or [])


def as_builtins(value: msgspec.Struct) -> dict[str, Any]:
    """A chat derender answer as JSON values (the shape the API converters read)."""
    out: dict[str, Any] = msgspec.to_builtins(value)
    return out


def chunk_ids(chunk: GenerateChunk) -> list[int]:
    return list(chunk.choices[0].token_ids or []) if chunk.choices else []


def chat_delta(
    chunk: ChatCompletionStreamResponse,
) -> tuple[dict[str, Any] | None, str | None, Any]:
    """(delta, finish_reason, stop_reason) of a derendered chat chunk; Nones for usage-only."""
    if not chunk.choices:
        return None, None, None
    choice = chunk.choices[0]
    delta: dict[str, Any] = msgspec.to_builtins(choice.delta)
    return delta, choice.finish_reason, choice.stop_reason


class _Bound(msgspec.Struct, Generic[S], frozen=True, array_like=True):
    """An API state with a digest of the chat state it was issued with."""

    chat: bytes
    state: S


def _digest(chat: str) -> bytes:
    return hashlib.sha256(chat.encode()).digest()[:16]


def split_state(
    codec: StateCodec, token: str | None, type_: type[S]
) -> tuple[str | None, S | None]:
    """``<chat state>~<api state>`` -> the chat token and the verified API state."""
    if token is None:
        return None, None
    chat, separator, api = token.rpartition(_SEPARATOR)
    if not separator:
        raise StreamStateError(
            "stream_state was not issued by this endpoint (it has no API state)", "stream_state"
        )
    bound = codec.decode(api, _Bound[type_])  # type: ignore[valid-type]
    if not hmac.compare_digest(bound.chat, _digest(chat)):
        raise StreamStateError(
            "stream_state's parts come from different calls or streams", "stream_state"
        )
    return chat or None, bound.state


def join_state(codec: StateCodec, chat: str | None, state: msgspec.Struct) -> str:
    chat = chat or ""
    return f"{chat}{_SEPARATOR}{codec.encode(_Bound(_digest(chat), state))}"


def chat_stream(
    d: Derenderer,
    body: DerenderMessagesStreamRequest | DerenderResponsesStreamRequest,
    chunks: Sequence[GenerateChunk],
    chat_token: str | None,
    chat_request: dict[str, Any] | None,
    kind: str,
) -> tuple[list[ChatCompletionStreamResponse], str | None]:
    """The chat stream machine over ``chunks``: one chat chunk each, and the chat state after
    (signed for ``kind``, the API's endpoint, so it continues nowhere else)."""
    answer = d.derender_chat_stream(
        DerenderChatStreamRequest(
            stream=True,
            generate_chunks=list(chunks),
            model=body.model,
            stream_state=chat_token,
            prompt_tokens=body.prompt_tokens,
            prompt_token_ids=body.prompt_token_ids,
            chat_request=chat_request,
        ),
        kind=kind,
    )
    if not isinstance(answer, ChatDerenderChunks):  # generate_chunks always gets the list form
        return [answer.chunk], answer.stream_state
    return answer.chunks, answer.stream_state
