"""The ``render-service`` console script (``render_service.cli:main``); the CLI is render_service.http.cli."""

from __future__ import annotations

from render_service.http.cli import main

__all__ = ["main"]
