"""The Starlette application for one model: its routes and middleware."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from render_service.derender import build_derenderer
from render_service.http import metrics
from render_service.http.direct import Direct
from render_service.http.errors import Handler, http_error
from render_service.http.handlers import Service
from render_service.render import Renderer


def build_app(renderer: Renderer) -> Starlette:
    """The Starlette application for one model."""
    service = Service(
        renderer, build_derenderer(renderer.model, renderer.parsing, renderer.settings)
    )
    g = service.guarded
    routes = [
        Route("/v1/chat/completions/render", g(service.render_chat), methods=["POST"]),
        Route("/v1/completions/render", g(service.render_completion), methods=["POST"]),
        Route("/v1/chat/completions/derender", g(service.derender_chat), methods=["POST"]),
        Route(
            "/v1/chat/completions/derender/streams",
            g(service.derender_chat_streams),
            methods=["POST"],
        ),
        Route("/v1/completions/derender", g(service.derender_completion), methods=["POST"]),
        Route("/v1/messages/render", g(service.render_messages), methods=["POST"]),
        Route("/v1/responses/render", g(service.render_responses), methods=["POST"]),
        Route("/v1/messages/derender", g(service.derender_messages), methods=["POST"]),
        Route("/v1/responses/derender", g(service.derender_responses), methods=["POST"]),
        Route("/tokenize", g(service.tokenize), methods=["POST"]),
        Route("/detokenize", g(service.detokenize), methods=["POST"]),
        Route("/v1/models", g(service.models), methods=["GET"]),
        Route("/health", service.health, methods=["GET"]),
        Route("/version", service.version, methods=["GET"]),
        Route("/ready", service.ready, methods=["GET"]),
        Route("/metrics", metrics.metrics_endpoint, methods=["GET"]),
        Route("/openapi.json", service.openapi, methods=["GET"]),
    ]
    metrics.pool_size(max(1, renderer.settings.renderer_num_workers))

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        # The app owns the service: its pools, encoder threads and sandbox processes end with it.
        try:
            yield
        finally:
            service.close()

    # The streaming derender endpoints answer once per generated chunk, chat and completion
    # render once per request at thousands per second: they skip the router.
    hot = ("/v1/chat/completions/derender", "/v1/chat/completions/render", "/v1/completions/")
    direct = {route.path: route.endpoint for route in routes if route.path.startswith(hot)}
    requests = metrics.RequestMetrics([r.path for r in routes])
    app = Starlette(
        routes=routes,
        exception_handlers={HTTPException: http_error},
        middleware=[
            Middleware(metrics.MetricsMiddleware, requests=requests),
            Middleware(DirectRoutes, routes=direct),
        ],
        lifespan=lifespan,
    )
    app.state.service = service
    # The same routes straight from the connection's protocol in the plain case (http.direct),
    # except a chat render that may answer with image tensors sent in parts.
    parts = renderer.multimodal is not None
    app.state.direct = Direct(
        {p: h for p, h in direct.items() if not (parts and p == "/v1/chat/completions/render")},
        requests,
    )
    return app


class DirectRoutes:
    """Sends a POST to one of ``routes`` (path -> guarded handler) straight to its handler.

    The router and its exception wrappers add nothing there: a guarded handler answers every
    error itself (``errors.guarded``). Anything else, and any path under a root path, goes on
    to the router as before.
    """

    def __init__(self, app: ASGIApp, routes: dict[str, Handler]) -> None:
        self.app = app
        self.routes = routes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] == "POST" and not scope.get("root_path"):
            handler = self.routes.get(scope["path"])
            if handler is not None:
                response = await handler(Request(scope, receive, send))
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)
