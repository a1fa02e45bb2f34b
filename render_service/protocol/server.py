"""Answers about the server itself: /v1/models, /version, and vLLM's error bodies."""

from __future__ import annotations

from typing import Any, Literal

import msgspec


class ModelCard(msgspec.Struct, kw_only=True):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "vllm"
    root: str
    parent: None = None
    max_model_len: int
    permission: list[Any] = msgspec.field(default_factory=list)


class ModelList(msgspec.Struct, kw_only=True):
    object: Literal["list"] = "list"
    data: list[ModelCard]


class VersionResponse(msgspec.Struct, kw_only=True):
    version: str


class ErrorInfo(msgspec.Struct, kw_only=True):
    message: str
    type: str
    param: str | None = None
    code: int


class ErrorResponse(msgspec.Struct, kw_only=True):
    """vLLM's error body; the HTTP status equals ``error.code``."""

    error: ErrorInfo


class UnauthorizedResponse(msgspec.Struct, kw_only=True):
    """vLLM's 401 body for a missing or wrong API key: ``{"error": "Unauthorized"}``."""

    error: Literal["Unauthorized"] = "Unauthorized"


class DetailResponse(msgspec.Struct, kw_only=True):
    """Starlette's error shape, which vLLM answers for a body that is not UTF-8."""

    detail: str
