"""The OpenAPI 3.1 document served at ``GET /openapi.json``, generated from the msgspec wire schemas.

The request schemas are the very Structs the handlers decode with, so the document cannot drift
from what the server accepts. Responses the handlers build as plain dicts get small Structs here
that exist only to describe them.
"""

from __future__ import annotations

from typing import Any, Literal

import msgspec

from render_service import __version__
from render_service.protocol.chat import ChatCompletionRequest
from render_service.protocol.completions import CompletionRequest
from render_service.protocol.derender import (
    DerenderChatRequest,
    DerenderChatStreamRequest,
    DerenderCompletionRequest,
    DerenderCompletionStreamRequest,
)
from render_service.protocol.generate import GenerateRequest
from render_service.protocol.tokenize import (
    DetokenizeRequest,
    TokenizeChatRequest,
    TokenizeCompletionRequest,
)

__all__ = ["openapi_document"]

_REF = "#/components/schemas/{name}"


class ErrorInfo(msgspec.Struct):
    message: str
    type: str
    param: str | None
    code: int


class ErrorResponse(msgspec.Struct):
    """vLLM's error body; the HTTP status equals ``error.code``."""

    error: ErrorInfo


class TokenizeResponse(msgspec.Struct):
    count: int
    max_model_len: int
    tokens: list[int]
    token_strs: list[str] | None


class DetokenizeResponse(msgspec.Struct):
    prompt: str


class ModelCard(msgspec.Struct):
    id: str
    object: Literal["model"]
    created: int
    owned_by: str
    root: str
    parent: str | None
    max_model_len: int
    permission: list[Any]


class ModelList(msgspec.Struct):
    object: Literal["list"]
    data: list[ModelCard]


class Version(msgspec.Struct):
    version: str


class DerenderResponse(msgspec.Struct):
    """A ChatCompletion/Completion, or one chunk plus ``stream_state`` (see the vLLM contract)."""

    id: str
    object: str
    created: int
    model: str
    choices: list[dict[str, Any]]


# (path, method, summary, request types (one of), response type or None for an empty 200)
_OPERATIONS: tuple[tuple[str, str, str, tuple[Any, ...], Any], ...] = (
    (
        "/v1/chat/completions/render",
        "post",
        "Render a chat request to token ids",
        (ChatCompletionRequest,),
        GenerateRequest,
    ),
    (
        "/v1/completions/render",
        "post",
        "Render a completion request to token ids",
        (CompletionRequest,),
        list[GenerateRequest],
    ),
    (
        "/v1/chat/completions/derender",
        "post",
        "Turn generated token ids into a chat completion or one stream chunk",
        (DerenderChatRequest, DerenderChatStreamRequest),
        DerenderResponse,
    ),
    (
        "/v1/completions/derender",
        "post",
        "Turn generated token ids into a completion or one stream chunk",
        (DerenderCompletionRequest, DerenderCompletionStreamRequest),
        DerenderResponse,
    ),
    (
        "/tokenize",
        "post",
        "Tokenize a prompt or a chat",
        (TokenizeCompletionRequest, TokenizeChatRequest),
        TokenizeResponse,
    ),
    ("/detokenize", "post", "Decode token ids", (DetokenizeRequest,), DetokenizeResponse),
    ("/v1/models", "get", "The served model", (), ModelList),
    ("/version", "get", "Server version", (), Version),
    ("/health", "get", "Liveness", (), None),
)
_ERROR_STATUSES = {
    "400": "Invalid request, schema mismatch, or a server limit (the message names the flag)",
    "401": "Missing or wrong API key",
    "404": "Unknown model",
    "408": "The request ran longer than --request-timeout",
    "413": "Body larger than --max-body-bytes",
}


def _schema_for(types: tuple[Any, ...], schemas: list[dict[str, Any]]) -> dict[str, Any]:
    picked = [schemas.pop(0) for _ in types]
    return picked[0] if len(picked) == 1 else {"anyOf": picked}


def openapi_document() -> dict[str, Any]:
    """The whole document as builtins, ready to encode."""
    all_types: list[Any] = [ErrorResponse]
    for _, _, _, requests, response in _OPERATIONS:
        all_types.extend(requests)
        if response is not None:
            all_types.append(response)
    schemas, components = msgspec.json.schema_components(all_types, ref_template=_REF)
    queue = list(schemas)
    error_schema = queue.pop(0)
    paths: dict[str, Any] = {}
    for path, method, summary, requests, response in _OPERATIONS:
        operation: dict[str, Any] = {"summary": summary, "operationId": summary.replace(" ", "_")}
        if requests:
            operation["requestBody"] = {
                "required": True,
                "content": {"application/json": {"schema": _schema_for(requests, queue)}},
            }
        ok: dict[str, Any] = {"description": "OK"}
        if response is not None:
            ok["content"] = {"application/json": {"schema": queue.pop(0)}}
        errors = {
            status: {
                "description": text,
                # vLLM answers 401 with {"error": "Unauthorized"}, not the ErrorResponse shape.
                "content": {
                    "application/json": {
                        "schema": {"type": "object"} if status == "401" else error_schema
                    }
                },
            }
            for status, text in _ERROR_STATUSES.items()
            if requests or status in ("401", "404")
        }
        operation["responses"] = {"200": ok, **errors}
        paths[path] = {method: operation}
    return {
        "openapi": "3.1.0",
        "info": {"title": "render-service", "version": __version__},
        "paths": paths,
        "components": {"schemas": components},
    }
