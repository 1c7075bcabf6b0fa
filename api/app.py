"""The FastAPI application: ``create_app(kernel, keys)``. Routes are thin; the Kernel
does the work. Every route but ``/healthz`` needs an API key."""

from __future__ import annotations

from fastapi import Depends, FastAPI
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from fak import __version__
from fak.api import accesslog, console, metrics, problems
from fak.api.authlog import LABEL as AUTH_FAILURE_LABEL
from fak.api.authlog import AuthFailureWindow
from fak.api.console.history import MetricsHistory, tenant_totals
from fak.api.deps import READER
from fak.api.keys import KeyStore, Principal
from fak.api.mcp_gateway import McpEndpoint
from fak.api.routes import audit, forget, mcp_servers, openai, policy, refs, responses, sessions, tiles
from fak.kernel.facade import Kernel

MAX_BODY = 16 << 20  # bytes of one request body


class BodyLimit:
    """413 (problem+json) for a request body over ``limit`` bytes: before reading it when
    ``Content-Length`` says so, else as soon as the streamed bytes pass it (an
    ``HTTPException`` raised from ``receive`` is one FastAPI's body parser lets through)."""

    def __init__(self, app: ASGIApp, limit: int) -> None:
        self.app, self.limit = app, limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            declared = dict(scope.get("headers") or []).get(b"content-length")
            if declared is not None and (not declared.isdigit() or int(declared) > self.limit):
                response = problems.problem(413, "request_too_large", f"request body over {self.limit} bytes")
                return await response(scope, receive, send)
            seen = 0

            async def limited() -> Message:
                nonlocal seen
                message = await receive()
                if message["type"] == "http.request":
                    seen += len(message.get("body", b""))
                    if seen > self.limit:
                        raise StarletteHTTPException(413, f"request body over {self.limit} bytes")
                return message

            return await self.app(scope, limited, send)
        return await self.app(scope, receive, send)


def create_app(kernel: Kernel, keys: KeyStore | None = None, *, max_body: int = MAX_BODY) -> FastAPI:
    app = FastAPI(
        docs_url=None,  # no unauthenticated route but /healthz: the schema is served behind a key
        redoc_url=None,
        openapi_url=None,
        title="fak",
        version=__version__,
        description="Agent-runtime security kernel: sessions whose KV cache fak owns, a policy gate for "
                    "tool results, exact eviction, forget with signed receipts, a verifiable audit log.",
    )
    app.state.kernel = kernel
    app.state.keys = keys or KeyStore.of(kernel)
    # failures counted per window, fingerprinted under a server key (issue 25.5)
    app.state.auth_failures = AuthFailureWindow(kernel.audit, kernel.derive_key(AUTH_FAILURE_LABEL),
                                                kernel.settings.auth_failure_window_s)
    app.router.on_shutdown.append(app.state.auth_failures.close)
    accesslog.install()  # no key in the access log, wherever a client put it
    problems.install(app)
    app.add_middleware(BodyLimit, limit=max_body)

    @app.get("/healthz", tags=["health"])
    def healthz() -> dict[str, str]:
        """Liveness: the only route without an API key."""
        return {"status": "ok"}

    for module in (sessions, forget, audit, tiles, policy, refs, openai, responses, mcp_servers):
        app.include_router(module.router)

    # the MCP gateway (docs/mcp.md): the declared MCP servers, each call authorized first; same keys
    mcp = app.state.mcp_gateway = McpEndpoint(kernel)
    app.router.routes.append(Route("/mcp", mcp, methods=["GET", "POST", "DELETE"], include_in_schema=False))
    app.router.on_shutdown.append(mcp.aclose)

    @app.get("/openapi.json", tags=["health"], include_in_schema=False)
    def openapi_schema(_who: Principal = Depends(READER)) -> JSONResponse:  # noqa: B008
        """The OpenAPI document (any valid key)."""
        return JSONResponse(app.openapi())

    app.include_router(console.router)  # the console's pages (docs/console.md): a cookie session, not a key
    metrics.install(app)
    history = app.state.metrics_history = MetricsHistory(lambda: tenant_totals(app.state.metrics.registry, kernel))
    app.router.on_startup.append(history.start)  # the console's charts (api/console/history.py)
    app.router.on_shutdown.append(history.stop)
    return app
