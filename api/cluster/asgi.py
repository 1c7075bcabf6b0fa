"""One HTTP request through an ASGI app in process, its answer streamed back: how a replica
(``fak.api.cluster.replica``) runs the router's requests through the same FastAPI app ``fak
serve`` runs, so server-sent events stay a stream across the Ray hop."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Mapping
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

if TYPE_CHECKING:
    from starlette.types import ASGIApp

log = logging.getLogger("fak.cluster")

# the first item stream_asgi yields: status, headers, the first body chunk, and whether more follows
# (a JSON answer is one item; a stream's chunks follow as bytes)
Head = tuple[int, list[tuple[str, str]], bytes, bool]


async def stream_asgi(app: ASGIApp, method: str, path: str, query: bytes, headers: list[tuple[str, str]],
                      body: bytes, client: tuple[str, int] | None = None, *,
                      name: str = "replica") -> AsyncIterator[Head | bytes]:
    """Run one request through an ASGI app in process: yields the head (status, headers, the
    first body chunk, whether more follows), then the rest of the body in the chunks the app
    sent. A caller that stops reading (its client went away) reaches the app as
    ``http.disconnect``, so a stream's cleanup runs as it does under uvicorn."""
    messages: asyncio.Queue[dict[str, Any] | None] = asyncio.Queue()
    gone = asyncio.Event()
    delivered = False

    async def receive() -> dict[str, Any]:
        nonlocal delivered
        if not delivered:
            delivered = True
            return {"type": "http.request", "body": body, "more_body": False}
        await gone.wait()
        return {"type": "http.disconnect"}

    async def send(message: Mapping[str, Any]) -> None:
        await messages.put(dict(message))

    scope: dict[str, Any] = {
        "type": "http", "asgi": {"version": "3.0", "spec_version": "2.3"}, "http_version": "1.1",
        "method": method, "scheme": "http", "path": path, "raw_path": quote(path).encode("ascii"),
        "query_string": query, "root_path": "", "client": client, "server": None,
        "headers": [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in headers],
    }

    async def run() -> None:
        try:
            await app(scope, receive, send)
        except Exception:  # the app's error middleware has answered 500 when it could
            log.exception("%s: %s %s failed", name, method, path)
            await messages.put({"type": "http.response.start", "status": 500, "headers": []})
        finally:
            await messages.put(None)

    task = asyncio.create_task(run())
    head: tuple[int, list[tuple[str, str]]] | None = None
    sent = False
    try:
        while (message := await messages.get()) is not None:
            if message["type"] == "http.response.start" and head is None:
                head = (int(message["status"]),
                        [(k.decode("latin-1"), v.decode("latin-1")) for k, v in message.get("headers", [])])
            elif message["type"] == "http.response.body" and head is not None:
                chunk, more = bytes(message.get("body", b"")), bool(message.get("more_body", False))
                if not sent:  # the head travels with the first chunk: one message for a whole JSON answer
                    sent = True
                    yield (*head, chunk, more)
                elif chunk:
                    yield chunk
                if not more:
                    break
        if not sent:  # the app ended without a body (or without answering at all)
            yield (*(head or (500, [])), b"", False)
    finally:
        gone.set()  # the app sees the client leave (a stream's rollback) or has finished
        if task.done():
            task.result()
