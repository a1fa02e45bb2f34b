"""The library for RL and evaluation (docs/library.md): render and derender in one object."""

from __future__ import annotations

from render_service.derender.inprocess import ChatStream
from render_service.library.renderer import Renderer

__all__ = ["ChatStream", "Renderer"]
