"""The OpenAPI 3.1 document served at ``GET /openapi.json``, generated from the msgspec wire schemas.

Request and response schemas are the very Structs the handlers decode and encode with, so the
document cannot drift from what the server accepts and answers.
"""

from __future__ import annotations

from typing import Any

import msgspec

from render_service import __version__
from render_service.protocol.chat import ChatCompletionRequest, ChatCompletionResponse
from render_service.protocol.completions import CompletionRequest, CompletionResponse
from render_service.protocol.derender import (
    ChatDerenderChunk,
    ChatDerenderChunks,
    ChatDerenderStreams,
    CompletionDerenderChunk,
    DerenderChatRequest,
    DerenderChatStreamRequest,
    DerenderChatStreamsRequest,
    DerenderCompletionRequest,
    DerenderCompletionStreamRequest,
    DerenderMessagesRequest,
    DerenderMessagesStreamRequest,
    DerenderResponsesRequest,
    DerenderResponsesStreamRequest,
)
from render_service.protocol.generate import GenerateRequest
from render_service.protocol.messages import (
    AnthropicMessagesRequest,
    MessagesDerenderEvents,
    MessagesResponse,
)
from render_service.protocol.responses import (
    ResponsesDerenderEvents,
    ResponsesRequest,
    ResponsesResponse,
)
from render_service.protocol.server import (
    ErrorResponse,
    ModelList,
    UnauthorizedResponse,
    VersionResponse,
)
from render_service.protocol.tokenize import (
    DetokenizeRequest,
    DetokenizeResponse,
    TokenizeChatRequest,
    TokenizeCompletionRequest,
    TokenizeResponse,
)

__all__ = ["openapi_document"]

_REF = "#/components/schemas/{name}"


# (path, method, summary, request types (one of), response types (one of; none: an empty 200))
_OPERATIONS: tuple[tuple[str, str, str, tuple[Any, ...], tuple[Any, ...]], ...] = (
    (
        "/v1/chat/completions/render",
        "post",
        "Render a chat request to token ids",
        (ChatCompletionRequest,),
        (GenerateRequest,),
    ),
    (
        "/v1/completions/render",
        "post",
        "Render a completion request to token ids",
        (CompletionRequest,),
        (list[GenerateRequest],),
    ),
    (
        "/v1/chat/completions/derender",
        "post",
        "Turn generated token ids into a chat completion or one stream chunk",
        (DerenderChatRequest, DerenderChatStreamRequest),
        (ChatCompletionResponse, ChatDerenderChunk, ChatDerenderChunks),
    ),
    (
        "/v1/chat/completions/derender/streams",
        "post",
        "One stream chunk for each of many chat streams (one engine step); JSON or msgpack",
        (DerenderChatStreamsRequest,),
        (ChatDerenderStreams,),
    ),
    (
        "/v1/completions/derender",
        "post",
        "Turn generated token ids into a completion or one stream chunk",
        (DerenderCompletionRequest, DerenderCompletionStreamRequest),
        (CompletionResponse, CompletionDerenderChunk),
    ),
    (
        "/tokenize",
        "post",
        "Tokenize a prompt or a chat",
        (TokenizeCompletionRequest, TokenizeChatRequest),
        (TokenizeResponse,),
    ),
    (
        "/v1/messages/render",
        "post",
        "Render an Anthropic Messages request to token ids",
        (AnthropicMessagesRequest,),
        (GenerateRequest,),
    ),
    (
        "/v1/responses/render",
        "post",
        "Render an OpenAI Responses request to token ids",
        (ResponsesRequest,),
        (GenerateRequest,),
    ),
    (
        "/v1/messages/derender",
        "post",
        "Turn generated token ids into an Anthropic message or its stream events",
        (DerenderMessagesRequest, DerenderMessagesStreamRequest),
        (MessagesResponse, MessagesDerenderEvents),
    ),
    (
        "/v1/responses/derender",
        "post",
        "Turn generated token ids into an OpenAI response or its stream events",
        (DerenderResponsesRequest, DerenderResponsesStreamRequest),
        (ResponsesResponse, ResponsesDerenderEvents),
    ),
    ("/detokenize", "post", "Decode token ids", (DetokenizeRequest,), (DetokenizeResponse,)),
    ("/v1/models", "get", "The served model", (), (ModelList,)),
    ("/version", "get", "Server version", (), (VersionResponse,)),
    ("/health", "get", "Liveness", (), ()),
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
    all_types: list[Any] = [ErrorResponse, UnauthorizedResponse]
    for _, _, _, requests, responses in _OPERATIONS:
        all_types.extend(requests)
        all_types.extend(responses)
    schemas, components = msgspec.json.schema_components(all_types, ref_template=_REF)
    queue = list(schemas)
    error_schema = queue.pop(0)
    unauthorized_schema = queue.pop(0)
    paths: dict[str, Any] = {}
    for path, method, summary, requests, responses in _OPERATIONS:
        operation: dict[str, Any] = {"summary": summary, "operationId": summary.replace(" ", "_")}
        if requests:
            operation["requestBody"] = {
                "required": True,
                "content": {"application/json": {"schema": _schema_for(requests, queue)}},
            }
        ok: dict[str, Any] = {"description": "OK"}
        if responses:
            ok["content"] = {"application/json": {"schema": _schema_for(responses, queue)}}
        errors = {
            status: {
                "description": text,
                # vLLM answers 401 with {"error": "Unauthorized"}, not the ErrorResponse shape.
                "content": {
                    "application/json": {
                        "schema": unauthorized_schema if status == "401" else error_schema
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
