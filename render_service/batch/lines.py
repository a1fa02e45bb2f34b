"""One JSONL line -> one JSONL answer: the body an HTTP endpoint takes, the answer it gives.

``render`` lines are chat render bodies (``messages``) or completion render bodies (``prompt``);
``derender`` lines are batch derender bodies (``generate_response`` for chat,
``generate_responses`` for completions). A line that fails answers with vLLM's error shape; it
never stops the run.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal

import msgspec

from render_service.errors import RenderServiceError
from render_service.library import Renderer
from render_service.protocol.chat import ChatCompletionRequest
from render_service.protocol.completions import CompletionRequest
from render_service.protocol.derender import DerenderChatRequest, DerenderCompletionRequest
from render_service.protocol.server import ErrorInfo
from render_service.validation import decode_body

Mode = Literal["render", "derender"]


class Answer(msgspec.Struct, kw_only=True, omit_defaults=True):
    """One output line: the input line's number (1-based) and its result or its error."""

    line: int
    result: Any = None
    error: ErrorInfo | None = None


class _Kind(msgspec.Struct):
    """Just the keys that pick a line's body type, left undecoded (the body is decoded next)."""

    messages: msgspec.Raw = msgspec.Raw()
    generate_responses: msgspec.Raw = msgspec.Raw()


def _given(value: msgspec.Raw) -> bool:
    """Whether a key is present and not ``null``."""
    return bytes(value) not in (b"", b"null")


_kind = msgspec.json.Decoder(_Kind)
_chat = msgspec.json.Decoder(ChatCompletionRequest)
_completion = msgspec.json.Decoder(CompletionRequest)
_derender_chat = msgspec.json.Decoder(DerenderChatRequest)
_derender_completion = msgspec.json.Decoder(DerenderCompletionRequest)
_encoder = msgspec.json.Encoder()


def _render(renderer: Renderer, data: bytes) -> Any:
    if _given(_kind.decode(data).messages):
        return renderer.render_chat(decode_body(data, _chat))
    return renderer.render_completion(decode_body(data, _completion))


def _derender(renderer: Renderer, data: bytes) -> Any:
    derenderer = renderer.derenderer
    if _given(_kind.decode(data).generate_responses):
        return derenderer.derender_completion(decode_body(data, _derender_completion))
    return derenderer.derender_chat(decode_body(data, _derender_chat))


HANDLERS: dict[Mode, Callable[[Renderer, bytes], Any]] = {
    "render": _render,
    "derender": _derender,
}


def answer_line(renderer: Renderer, mode: Mode, number: int, data: bytes) -> Answer:
    """The answer to input line ``number``."""
    try:
        if not data.strip():
            raise RenderServiceError("empty line")
        data.decode("utf-8")
        answer = Answer(line=number, result=HANDLERS[mode](renderer, data))
    except RenderServiceError as exc:
        answer = Answer(
            line=number, error=_error(exc.message, exc.error_type, exc.param, exc.status)
        )
    except (msgspec.DecodeError, UnicodeDecodeError) as exc:
        answer = Answer(line=number, error=_error(f"not a JSON object: {exc}", "BadRequestError"))
    except Exception as exc:  # a bug on one line must not stop the run: it is that line's answer
        answer = Answer(line=number, error=_error(repr(exc), "InternalServerError", code=500))
    return answer


def encode_answers(answers: list[Answer]) -> bytes:
    """Answers as JSONL."""
    return b"".join(_encoder.encode(a) + b"\n" for a in answers)


def _error(message: str, kind: str, param: str | None = None, code: int = 400) -> ErrorInfo:
    return ErrorInfo(message=message, type=kind, param=param, code=code)
