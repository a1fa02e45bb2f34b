"""The derender path: generated token ids back into OpenAI chat and completion responses."""

from __future__ import annotations

from render_service.derender.derenderer import Derenderer, build_derenderer

__all__ = ["Derenderer", "build_derenderer"]
