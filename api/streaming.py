"""A server-sent-events response that always gives its turn up when it ends: whether the body
ran to the end, the client went away mid-stream, or the response was cancelled before its
body started (then a generator's own ``finally`` never runs, and the session's lock would stay
held until the turn is garbage-collected). Every streaming door uses it: ``POST
/v1/sessions/{sid}/generate``, ``POST /v1/chat/completions`` and ``POST /v1/responses``
(these two through ``open_sse``)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Protocol, TypeVar

import anyio
from fastapi.responses import StreamingResponse
from starlette.concurrency import run_in_threadpool
from starlette.types import Receive, Scope, Send


class ClosingStream(StreamingResponse):
    """SSE over ``events``; ``close`` (idempotent, blocking: it runs in a worker thread) is
    called exactly once after the response ends, however it ends. A turn that finished is
    kept; one given up before its end is rolled back by its own ``close``."""

    def __init__(self, events: AsyncIterator[str], close: Callable[[], None], *,
                 headers: dict[str, str] | None = None) -> None:
        super().__init__(events, media_type="text/event-stream",
                         headers={"Cache-Control": "no-store", **(headers or {})})
        self._events = events
        self._close = close

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            with anyio.CancelScope(shield=True):
                aclose = getattr(self._events, "aclose", None)
                if aclose is not None:
                    await aclose()
                await run_in_threadpool(self._close)


class Closable(Protocol):
    def close(self) -> None: ...


S = TypeVar("S", bound=Closable)


async def open_sse(opener: Callable[[], S], events: Callable[[S], AsyncIterator[str]]) -> ClosingStream:
    """Open a stream in a worker thread, so its errors (a busy session, a refused parameter)
    are answered before any 200, then serve ``events(stream)``; a handler cancelled while
    opening closes what it opened."""
    held: list[S] = []

    def start() -> None:
        held.append(opener())

    try:
        await run_in_threadpool(start)
    except BaseException:
        if held:
            with anyio.CancelScope(shield=True):
                await run_in_threadpool(held[0].close)
        raise
    return ClosingStream(events(held[0]), held[0].close, headers={"X-Accel-Buffering": "no"})
