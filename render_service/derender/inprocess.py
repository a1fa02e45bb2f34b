"""In-process derender for the library: the HTTP derender bodies built from plain arguments.

``derender_chat`` and ``ChatStream`` wrap the same ``Derenderer`` calls the HTTP endpoints make,
so their answers are the HTTP answers for the same ids (tests/render_service/library/test_derender_parity.py).
"""

from __future__ import annotations

from typing import Any

import msgspec

from render_service.derender.derenderer import Derenderer
from render_service.protocol.chat import (
    ChatCompletionRequest,
    ChatCompletionResponseChoice,
    ChatCompletionResponseStreamChoice,
)
from render_service.protocol.derender import (
    ChatDerenderChunk,
    DerenderChatRequest,
    DerenderChatStreamRequest,
)
from render_service.protocol.logprobs import GenerateLogProbs
from render_service.validation import convert

REQUEST_ID = "chatcmpl-library"


def _wire_request(request: ChatCompletionRequest | dict[str, Any] | None) -> dict[str, Any] | None:
    if request is None or isinstance(request, dict):
        return request
    wire: dict[str, Any] = msgspec.to_builtins(request)
    return wire


def derender_chat(
    derenderer: Derenderer,
    prompt_ids: list[int],
    output_ids: list[int],
    request: ChatCompletionRequest | dict[str, Any] | None,
    *,
    finish_reason: str | None = "stop",
    stop_reason: int | str | None = None,
    logprobs: GenerateLogProbs | dict[str, Any] | None = None,
    index: int = 0,
) -> ChatCompletionResponseChoice:
    """The choice the HTTP batch chat derender answers for these ids."""
    choice = _choice(index, finish_reason, stop_reason, output_ids, logprobs)
    body = convert(
        {
            "generate_response": {"request_id": REQUEST_ID, "choices": [choice]},
            "prompt_token_ids": prompt_ids,
            "chat_request": _wire_request(request),
        },
        DerenderChatRequest,
        "body",
    )
    return derenderer.derender_chat(body).choices[0]


def _choice(
    index: int,
    finish_reason: str | None,
    stop_reason: int | str | None,
    ids: list[int],
    logprobs: GenerateLogProbs | dict[str, Any] | None,
) -> dict[str, Any]:
    """A generate choice as the wire has it: converting it checks the ids as the HTTP body does."""
    if isinstance(logprobs, GenerateLogProbs):
        logprobs = msgspec.to_builtins(logprobs)
    return {
        "index": index,
        "finish_reason": finish_reason,
        "stop_reason": stop_reason,
        "token_ids": ids,
        "logprobs": logprobs,
    }


class ChatStream:
    """One generation parsed as it streams: ``feed`` ids, get the delta they add.

    ``state`` is the HTTP stream state (a signed string, portable between processes that share
    ``state_secret``): a stream made with ``state=`` continues where that state left off.
    """

    def __init__(
        self,
        derenderer: Derenderer,
        request: ChatCompletionRequest | dict[str, Any] | None,
        prompt_ids: list[int] | None,
        state: str | None = None,
        *,
        request_id: str = REQUEST_ID,
        index: int = 0,
    ) -> None:
        self._derenderer = derenderer
        self._request = _wire_request(request)
        self._prompt_ids = prompt_ids
        self._request_id = request_id
        self._index = index
        self.state: str | None = state
        self.finished = False

    def feed(
        self,
        ids: list[int],
        *,
        finish_reason: str | None = None,
        stop_reason: int | str | None = None,
        logprobs: GenerateLogProbs | dict[str, Any] | None = None,
    ) -> ChatCompletionResponseStreamChoice:
        """The stream choice (delta, finish_reason, logprobs) for the next generated ids; a
        ``finish_reason`` ends the stream and flushes what the parsers held back."""
        choice = _choice(self._index, finish_reason, stop_reason, ids, logprobs)
        body = convert(
            {
                "stream": True,
                "generate_chunk": {"request_id": self._request_id, "choices": [choice]},
                "stream_state": self.state,
                "prompt_token_ids": self._prompt_ids,
                "chat_request": self._request,
            },
            DerenderChatStreamRequest,
            "body",
        )
        answer = self._derenderer.derender_chat_stream(body)
        # One generate_chunk in, so one chunk out (ChatDerenderChunk, never the list form).
        chunk_out = answer.chunk if isinstance(answer, ChatDerenderChunk) else answer.chunks[0]
        self.state = answer.stream_state
        self.finished = finish_reason is not None
        return chunk_out.choices[0]
