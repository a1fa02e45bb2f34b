"""The base class of request bodies."""

from __future__ import annotations

import msgspec


class Body(msgspec.Struct, kw_only=True):
    """A request body: unknown fields are ignored, as vLLM's models allow extras."""
