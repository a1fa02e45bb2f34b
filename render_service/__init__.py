"""render-service: render OpenAI requests to token ids and derender generated ids, like vLLM 0.33."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

if TYPE_CHECKING:
    from render_service.library import ChatStream, Renderer
    from render_service.render.conversation import Extension, LossMask
    from render_service.settings import Settings

__all__ = ["ChatStream", "Extension", "LossMask", "Renderer", "Settings", "__version__"]


def __getattr__(name: str) -> Any:
    # Lazy: image worker processes import this package too and need none of transformers.
    if name in ("Renderer", "ChatStream"):
        from render_service import library

        return getattr(library, name)
    if name in ("Extension", "LossMask"):
        from render_service.render import conversation

        return getattr(conversation, name)
    if name == "Settings":
        from render_service.settings import Settings

        return Settings
    raise AttributeError(f"module 'render_service' has no attribute {name!r}")
