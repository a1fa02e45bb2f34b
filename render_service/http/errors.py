"""Errors become HTTP responses here, and only here: vLLM's error body for our error tree, its
401 and 400 shapes for a bad key or undecodable body, a 408 for --request-timeout, one logged
500 for anything else, and vLLM's error body for paths and methods no route takes (404, 405)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from http import HTTPStatus

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response

from render_service.errors import (
    BodyTooLarge,
    LimitExceeded,
    RenderServiceError,
    RequestTimeout,
    Unauthorized,
)
from render_service.http.auth import ApiKey
from render_service.http.deadlines import Deadlines
from render_service.http.responses import MsgspecResponse
from render_service.protocol.server import (
    DetailResponse,
    ErrorInfo,
    ErrorResponse,
    UnauthorizedResponse,
)

log = logging.getLogger("render_service")
Handler = Callable[[Request], Awaitable[Response]]
_UNDECODABLE = DetailResponse(detail="There was an error parsing the body")
_INTERNAL = ErrorResponse(
    error=ErrorInfo(message="Internal server error", type="InternalServerError", code=500)
)


def error_response(exc: RenderServiceError) -> Response:
    """vLLM's error body, with the HTTP status equal to ``error.code``."""
    info = ErrorInfo(message=exc.message, type=exc.error_type, param=exc.param, code=exc.status)
    # The rest of a refused body is never read: the connection closes after the answer (with a
    # lingering close, http.connections), and says so.
    headers = {"connection": "close"} if isinstance(exc, BodyTooLarge) else None
    return MsgspecResponse(ErrorResponse(error=info), status_code=exc.status, headers=headers)


def guarded(handler: Handler, *, timeout: float, api_key: ApiKey | None) -> Handler:
    """``handler`` behind the API key and the request timeout, with every error answered."""
    deadlines: Deadlines | None = None  # of the running loop (a server runs one)

    async def endpoint(request: Request) -> Response:
        nonlocal deadlines
        try:
            if api_key is not None:
                api_key.check(request)
            if not timeout:
                return await handler(request)
            # Cancelling the wait also cancels a render still queued for a worker thread; one
            # already running finishes its (limit-bounded) work, with no one waiting for it.
            # One timer per loop for all requests' deadlines (http.deadlines); an expired
            # request's task is cancelled, and its cancellation becomes the TimeoutError.
            task = asyncio.current_task()
            assert task is not None
            deadlines = mine = Deadlines.of(deadlines, timeout)
            key = mine.start(task.cancel)
            try:
                response = await handler(request)
            except BaseException as exc:
                if not mine.stop(key):
                    task.uncancel()
                    if isinstance(exc, asyncio.CancelledError):
                        raise TimeoutError from exc
                raise
            if not mine.stop(key):
                task.uncancel()
            return response
        except TimeoutError:
            return error_response(
                RequestTimeout(
                    f"The request took longer than this server's limit of {timeout} s "
                    "(--request-timeout)."
                )
            )
        except Unauthorized:
            return MsgspecResponse(UnauthorizedResponse(), status_code=401)
        except UnicodeDecodeError:
            return MsgspecResponse(_UNDECODABLE, status_code=400)
        except RenderServiceError as exc:
            return error_response(exc)
        except RecursionError:  # nesting deep enough to exhaust Python's stack somewhere
            return error_response(
                LimitExceeded("The request nests JSON too deeply (--max-json-depth).")
            )
        except Exception:
            log.exception("unhandled error on %s", request.url.path)
            return MsgspecResponse(_INTERNAL, status_code=500)

    return endpoint


# Paths where a client expecting a complete OpenAI or vLLM server posts a generation request.
_GENERATION_PATHS = frozenset(
    {
        "/v1/chat/completions",
        "/v1/completions",
        "/v1/messages",
        "/v1/responses",
        "/inference/v1/generate",
    }
)


def http_error(request: Request, exc: Exception) -> Response:
    """A 404 or 405 from routing, in vLLM's error body (vLLM's own routing answers FastAPI's
    ``{"detail": ...}``: docs/compat.md), saying what to do instead."""
    assert isinstance(exc, HTTPException)
    path = request.url.path
    if exc.status_code == 404 and path in _GENERATION_PATHS:
        render = "/v1/chat/completions" if path == "/inference/v1/generate" else path
        message = (
            f"{path} is not served here: render-service renders requests into token ids and "
            "derenders generated ids; generation is served by the engine (vllm serve "
            f"--tokens-only, POST /inference/v1/generate). Render with POST {render}/render, "
            "send its answer to the engine, and derender what the engine returns."
        )
    elif exc.status_code == 404:
        message = f"Not Found: no route for {path} (GET /openapi.json lists them)."
    elif exc.status_code == 405:
        headers = {name.lower(): value for name, value in (exc.headers or {}).items()}
        allowed = headers.get("allow", "")
        message = f"Method Not Allowed: {path} takes {allowed}, not {request.method}."
    else:
        message = str(exc.detail)
    info = ErrorInfo(message=message, type=HTTPStatus(exc.status_code).phrase, code=exc.status_code)
    return MsgspecResponse(
        ErrorResponse(error=info), status_code=exc.status_code, headers=exc.headers
    )
