"""The FastAPI application: ``create_app(kernel, keys)``. Routes are thin; the Kernel
does the work. Every route but ``/healthz`` needs an API key."""

from __future__ import annotations

from fastapi import FastAPI
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from fak import __version__
from fak.api import metrics, problems
from fak.api.keys import KeyStore
from fak.api.routes import audit, forget, openai, policy, refs, sessions
from fak.facade import Kernel

MAX_BODY = 16 << 20  # bytes of one request body


class BodyLimit:
    """413 for a request body over ``limit`` bytes, declared or streamed."""

    def __init__(self, app: ASGIApp, limit: int) -> None:
        self.app, self.limit = app, limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        declared = dict(scope.get("headers") or []).get(b"content-length")
        if declared is not None and (not declared.isdigit() or int(declared) > self.limit):
            return await problems.problem(413, "too_large", f"request body over {self.limit} bytes")(
                scope, receive, send)
        seen = 0

        async def limited() -> Message:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.limit:
                    raise problems.TooLarge(f"request body over {self.limit} bytes")
            return message

        return await self.app(scope, limited, send)


def create_app(kernel: Kernel, keys: KeyStore | None = None, *, max_body: int = MAX_BODY) -> FastAPI:
    app = FastAPI(
        title="fak",
        version=__version__,
        description="Agent-runtime security kernel: sessions whose KV cache fak owns, a policy gate for "
                    "tool results, exact eviction, forget with signed receipts, a verifiable audit log.",
    )
    app.state.kernel = kernel
    app.state.keys = keys or KeyStore(kernel.state.engine, kernel._master)
    problems.install(app)
    app.add_middleware(BodyLimit, limit=max_body)

    @app.get("/healthz", tags=["health"])
    def healthz() -> dict[str, str]:
        """Liveness: the only route without an API key."""
        return {"status": "ok"}

    for module in (sessions, forget, audit, policy, refs, openai):
        app.include_router(module.router)
    metrics.install(app)
    return app
