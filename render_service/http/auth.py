"""vLLM's ``--api-key``: a bearer token required on the API paths (not on probes or metrics)."""

from __future__ import annotations

import hashlib
import secrets

from starlette.requests import Request

from render_service.errors import Unauthorized

_GUARDED_PREFIXES = ("/v1", "/v2", "/inference")


class ApiKey:
    """Checks ``Authorization: Bearer <key>`` in constant time against a digest of the key."""

    def __init__(self, key: str) -> None:
        self._digest = hashlib.sha256(key.encode()).digest()

    def check(self, request: Request) -> None:
        """Unauthorized (401) when a guarded path lacks the right bearer token."""
        if not request.url.path.startswith(_GUARDED_PREFIXES):
            return
        header = request.headers.get("authorization", "")
        scheme, _, token = header.partition(" ")
        if scheme.lower() != "bearer":
            raise Unauthorized("Unauthorized")
        if not secrets.compare_digest(hashlib.sha256(token.encode()).digest(), self._digest):
            raise Unauthorized("Unauthorized")
