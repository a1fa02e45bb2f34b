"""Running the app under uvicorn, with one or more server processes."""

from __future__ import annotations

import logging
import os
import secrets

import msgspec
import uvicorn
from starlette.applications import Starlette

from render_service.settings import Settings

_SETTINGS_ENV = "RENDER_SERVICE_SETTINGS_JSON"
log = logging.getLogger("render_service")


def create_app() -> Starlette:
    """uvicorn factory: each worker process rebuilds the app from the settings its parent wrote."""
    from render_service.app import build_app
    from render_service.render import Renderer

    settings = msgspec.json.decode(os.environ[_SETTINGS_ENV], type=Settings)
    return build_app(Renderer.from_settings(settings))


def serve(settings: Settings, *, log_level: str = "info") -> None:
    logging.basicConfig(
        level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    if settings.state_secret is None:
        log.warning(
            "No --state-secret (or RENDER_SERVICE_STATE_SECRET): a random secret signs stream_state, "
            "so a stream CANNOT move to another replica. Give every replica the same secret."
        )
        # One secret for all worker processes of this server, so its own workers agree.
        settings = msgspec.structs.replace(settings, state_secret=secrets.token_hex(32))
    os.environ[_SETTINGS_ENV] = msgspec.json.encode(settings).decode()
    uvicorn.run(
        "render_service.server:create_app",
        factory=True,
        host=settings.host,
        port=settings.port,
        workers=settings.workers,
        loop="uvloop",
        http="httptools",
        log_level=log_level,
        access_log=False,
        timeout_graceful_shutdown=30,
    )
