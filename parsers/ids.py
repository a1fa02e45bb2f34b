"""Deterministic tool-call ids, so a retried chunk gets the same id."""

from __future__ import annotations

import hashlib

__all__ = ["tool_call_id"]


def tool_call_id(request_id: str, choice_index: int, tool_index: int) -> str:
    """`"chatcmpl-tool-"` + 16 hex digits derived from (request, choice, tool index)."""
    key = f"{request_id}\x1f{choice_index}\x1f{tool_index}".encode()
    return "chatcmpl-tool-" + hashlib.sha256(key).hexdigest()[:16]
