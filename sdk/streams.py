"""Streamed generation: the server-sent events of ``POST /v1/sessions/{sid}/generate`` (or
the same events from the in-process kernel) read as an iterator of text pieces."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

from fak.sdk.errors import FakAPIError
from fak.sdk.models import GenerateOut, StreamDone


class SSE:
    """Incremental parser of ``text/event-stream`` lines into (event, data) pairs."""

    def __init__(self) -> None:
        self.event = "message"
        self.data: list[str] = []

    def feed(self, line: str) -> tuple[str, str] | None:
        if line == "":
            if not self.data:
                self.event = "message"
                return None
            out = (self.event, "\n".join(self.data))
            self.event, self.data = "message", []
            return out
        if line.startswith(":"):
            return None
        name, _, value = line.partition(":")
        value = value[1:] if value.startswith(" ") else value
        if name == "event":
            self.event = value
        elif name == "data":
            self.data.append(value)
        return None


class _StreamState:
    """What a streamed generation has produced so far."""

    def __init__(self) -> None:
        self.tokens: list[int] = []
        self.pieces: list[str] = []
        self.done: StreamDone | None = None

    def on(self, event: str, data: str | dict[str, Any]) -> str | None:
        """Handle one event (data as JSON text, or already a dict); the text piece to yield, if any."""
        body = json.loads(data) if isinstance(data, str) else data
        if event == "done":
            self.done = StreamDone.model_validate(body)
            return None
        if event == "error":  # not sent by this server version, understood anyway
            raise FakAPIError.from_problem(int(body.get("status") or 500), body)
        self.tokens.append(int(body["token"]))
        text = body.get("text") or ""
        if text:
            self.pieces.append(text)
        return text or None

    def result(self) -> GenerateOut:
        if self.done is None:
            raise FakAPIError.from_problem(502, None, "the stream ended before its done event")
        return GenerateOut(text=self.text, tokens=self.tokens, segment=self.done.segment,
                           fingerprint=self.done.fingerprint)

    @property
    def text(self) -> str:
        return "".join(self.pieces)


class _StreamFields:
    """What a stream read so far (shared by the blocking and the async stream)."""

    _state: _StreamState

    @property
    def tokens(self) -> list[int]:
        return list(self._state.tokens)

    @property
    def text(self) -> str:
        return self._state.text

    @property
    def done(self) -> StreamDone | None:
        return self._state.done


class TextStream(_StreamFields, Iterator[str]):
    """A streamed generation: iterate for text pieces as they are decoded.

    After the last piece ``done`` holds the appended segment and the fingerprint,
    ``tokens`` every token id, ``text`` the whole text, and ``result()`` the same
    ``GenerateOut`` a non-streamed ``generate`` returns. ``close()`` (or leaving a
    ``with`` block) before the end gives the turn up: the server rolls it back and the
    session is as it was before the call."""

    def __init__(self, pieces: Iterator[tuple[str, Any]], close: Callable[[], None]) -> None:
        self._events = pieces
        self._close = close
        self._state = _StreamState()
        self._closed = False

    def __iter__(self) -> TextStream:
        return self

    def __next__(self) -> str:
        if self._closed:
            raise StopIteration
        try:
            while True:
                event, data = next(self._events)
                piece = self._state.on(event, data)
                if piece is not None:
                    return piece
        except StopIteration:
            self.close()
            raise
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._close()

    def __enter__(self) -> TextStream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def result(self) -> GenerateOut:
        """Read to the end; the turn as ``generate`` would have returned it."""
        for _ in self:
            pass
        return self._state.result()


class AsyncTextStream(_StreamFields, AsyncIterator[str]):
    """``TextStream`` for ``AsyncClient``: ``async for piece in stream``; ``await aclose()``."""

    def __init__(self, pieces: AsyncIterator[tuple[str, str]], close: Callable[[], Any]) -> None:
        self._events = pieces
        self._close = close
        self._state = _StreamState()
        self._closed = False

    def __aiter__(self) -> AsyncTextStream:
        return self

    async def __anext__(self) -> str:
        if self._closed:
            raise StopAsyncIteration
        try:
            while True:
                event, data = await self._events.__anext__()
                piece = self._state.on(event, data)
                if piece is not None:
                    return piece
        except BaseException:
            await self.aclose()
            raise

    async def aclose(self) -> None:
        if not self._closed:
            self._closed = True
            await self._close()

    async def __aenter__(self) -> AsyncTextStream:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def result(self) -> GenerateOut:
        async for _ in self:
            pass
        return self._state.result()


