"""The render path: chat and completion requests to the token ids an engine consumes."""

from __future__ import annotations

from render_service.render.renderer import Renderer

__all__ = ["Renderer"]
