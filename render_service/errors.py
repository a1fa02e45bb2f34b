"""Errors that cross the HTTP edge, each knowing its status and vLLM error ``type``.

    RenderServiceError            400-ish base: status + type + param
    ├── InvalidRequest            400 BadRequestError (explicit checks, template errors)
    │   ├── SchemaError           400 "Bad Request" (body does not match the schema)
    │   └── StatelessRefusal      400 invalid_request_error (Responses history we cannot look up)
    ├── Unauthorized              401 (vLLM answers {"error": "Unauthorized"})
    ├── ModelNotFound             404 NotFoundError
    ├── BodyTooLarge              413 BadRequestError
    ├── StreamStateError          400 BadRequestError (tampered, stale or foreign stream_state)
    ├── LimitExceeded             400 BadRequestError (a --max-* limit; the message names the flag)
    │   └── TemplateLimit         400 (a per-request template ran too long, too big or failed)
    └── RequestTimeout            408 RequestTimeoutError (--request-timeout)
        └── RequestAbandoned      408 (work stopped: no one waits for its answer any more)

Everything else that escapes a handler becomes a logged 500 InternalServerError in one place (app.py).
"""

from __future__ import annotations


class RenderServiceError(Exception):
    """Base class: an error with an HTTP status and a vLLM error type."""

    status: int = 400
    error_type: str = "BadRequestError"

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param


class InvalidRequest(RenderServiceError):
    """The request is well-formed JSON but asks for something we refuse."""


class SchemaError(InvalidRequest):
    """The body does not match the endpoint's schema (vLLM: pydantic RequestValidationError)."""

    error_type = "Bad Request"


class StatelessRefusal(InvalidRequest):
    """The request refers to server-side state that a stateless render tier does not keep."""

    error_type = "invalid_request_error"


class Unauthorized(RenderServiceError):
    status = 401
    error_type = "Unauthorized"


class ModelNotFound(RenderServiceError):
    status = 404
    error_type = "NotFoundError"


class BodyTooLarge(RenderServiceError):
    status = 413


class StreamStateError(RenderServiceError):
    """A stream_state that cannot be trusted or continued."""


class LimitExceeded(InvalidRequest):
    """The request is larger or deeper than a server limit allows; the message names the flag."""


class TemplateLimit(LimitExceeded):
    """A per-request chat template ran past its time, output or memory budget, or crashed."""


class RequestTimeout(RenderServiceError):
    """The request ran longer than --request-timeout (vLLM has no such limit)."""

    status = 408
    error_type = "RequestTimeoutError"


class RequestAbandoned(RequestTimeout):
    """The request was cancelled while its work ran in a thread; the work stops early."""


def invalid_param(message: str, param: str, value: object = None) -> InvalidRequest:
    """vLLM's VLLMValidationError message format: ``msg (parameter=p[, value=v])``."""
    suffix = f"parameter={param}" if value is None else f"parameter={param}, value={value}"
    return InvalidRequest(f"{message} ({suffix})", param)
