"""render-service: render OpenAI requests to token ids and derender generated ids, like vLLM 0.33."""

from __future__ import annotations

__version__ = "0.1.0"

from render_service.render import Renderer
from render_service.settings import Settings

__all__ = ["Renderer", "Settings", "__version__"]
