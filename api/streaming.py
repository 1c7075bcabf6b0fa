"""A server-sent-events response that always gives its turn up when it ends: whether the body
ran to the end, the client went away mid-stream, or the response was cancelled before its
body started (then a generator's own ``finally`` never runs, and the session's lock would stay
held until the turn is garbage-collected). Every streaming door uses it: ``POST
/v1/sessions/{sid}/generate``, ``POST /v1/chat/completions`` and ``POST /v1/responses``
(these two through ``open_sse``).

Its events come from ``steps``: the stream's model steps run one after the other in a thread
of the stream's own, at most ``AHEAD`` steps ahead of what the response has taken, so the
model computes the next token while the event loop sends this one. Handing each step to a
worker thread from the loop (a thread hop there and back per token) left the model idle while
the loop woke up, which costs most where the CPUs are busy.

A slow reader: once the socket's buffers are full the response stops taking results, the
thread stops after ``AHEAD`` of them (paused: no rows for the engine, which does not wait for
them) and goes on when the reader drains. A client that disconnects: the response ends, the
thread stops after the step it is in, and ``close`` rolls the turn back (docs/serving.md,
"The door")."""

from __future__ import annotations

import asyncio
import contextvars
import threading
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from typing import Generic, Protocol, TypeVar

import anyio
from fastapi.responses import StreamingResponse
from starlette.concurrency import run_in_threadpool
from starlette.types import Receive, Scope, Send

from fak.kernel.model.scheduler import rows_paused


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


R = TypeVar("R")
AHEAD = 8  # steps computed and not yet taken by the response, the one being computed included


class _Steps(Generic[R]):
    """``step`` called over and over in a thread of its own until it returns None (or raises),
    the results handed to the event loop without waiting for it; the thread starts a step only
    while fewer than ``AHEAD`` results wait to be taken. When that many wait (the client reads
    slower than the model writes, and the socket's buffers are full) the stream is paused: the
    thread sends the engine no rows and tells it not to wait for them (``rows_paused``) until
    the response takes a result. ``stop`` (from the loop, idempotent, never blocking) ends it
    before its next step. The thread runs in a copy of the caller's context (contextvars), as a
    worker thread of ``run_in_threadpool`` would."""

    def __init__(self, step: Callable[[], R | None]) -> None:
        self._step = step
        self._loop = asyncio.get_running_loop()
        self._results: asyncio.Queue[tuple[bool, R | BaseException | None]] = asyncio.Queue()
        self._room = threading.Condition()
        self._waiting = 0  # results handed over and not taken yet
        self._stopped = False
        context = contextvars.copy_context()
        threading.Thread(target=context.run, args=(self._run,), name="fak-stream", daemon=True).start()

    def _run(self) -> None:
        while True:
            with self._room:
                if not self._stopped and self._waiting >= AHEAD:
                    self._pause()
                if self._stopped:
                    return
                self._waiting += 1
            try:
                item: R | BaseException | None = self._step()
                ok = True
            except Exception as exc:  # raised in the response, as a worker thread's would be
                item, ok = exc, False
            try:
                self._loop.call_soon_threadsafe(self._results.put_nowait, (ok, item))
            except RuntimeError:  # the loop is closed: nobody is listening any more
                return
            if item is None or not ok:
                return

    def _pause(self) -> None:
        """Wait (holding ``_room``) until the response takes a result or stops the stream; the
        engine does not wait for this stream's rows meanwhile."""
        rows_paused()
        self._room.wait_for(lambda: self._stopped or self._waiting < AHEAD)

    async def take(self) -> R | None:
        """The next result (None after the last); re-raises what a step raised."""
        ok, item = await self._results.get()
        with self._room:
            self._waiting -= 1
            self._room.notify()
        if not ok:
            assert isinstance(item, BaseException)
            raise item
        return item  # type: ignore[return-value]

    def stop(self) -> None:
        with self._room:
            self._stopped = True
            self._room.notify()


async def steps(step: Callable[[], R | None]) -> AsyncGenerator[R, None]:
    """The results of ``step`` (a blocking model step: a token's event, a stream's chunks) up
    to the first None, computed in a thread of their own (see the module notes); the thread
    stops before its next step once the iteration ends (the response over, the client gone)."""
    pump = _Steps(step)
    try:
        while (item := await pump.take()) is not None:
            yield item
    finally:
        pump.stop()
