"""Errors become HTTP responses here, and only here: vLLM's error body for our error tree, its
401 and 400 shapes for a bad key or undecodable body, a 408 for --request-timeout, and one
logged 500 for anything else."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from starlette.requests import Request
from starlette.responses import Response

from render_service.errors import LimitExceeded, RenderServiceError, RequestTimeout, Unauthorized
from render_service.http.auth import ApiKey
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
    return MsgspecResponse(ErrorResponse(error=info), status_code=exc.status)


def guarded(handler: Handler, *, timeout: float, api_key: ApiKey | None) -> Handler:
    """``handler`` behind the API key and the request timeout, with every error answered."""

    async def endpoint(request: Request) -> Response:
        try:
            if api_key is not None:
                api_key.check(request)
            if not timeout:
                return await handler(request)
            # Cancelling the wait also cancels a render still queued for a worker thread; one
            # already running finishes its (limit-bounded) work, with no one waiting for it.
            return await asyncio.wait_for(handler(request), timeout)
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
