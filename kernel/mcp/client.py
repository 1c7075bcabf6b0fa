"""Talking to one MCP server: its tool list and its tool calls, over streamable HTTP or stdio,
with the official ``mcp`` SDK. The kernel is synchronous (threads); the SDK is async. One
event-loop thread (``McpLoop``) holds every open connection: each connection is one task that
entered the SDK's client and keeps it open until it is closed (anyio's scopes must be left by
the task that entered them), and a request is a coroutine run on that loop from the caller's
thread with a deadline. A connection that fails is dropped and opened again by the next request.

What comes back is bounded: a request waits at most the server's ``timeout_s``; a tool result
larger than ``max_result_bytes`` is an ``McpError`` (nothing of it is returned, so nothing of it
can be admitted); a tool list holds at most ``MAX_TOOLS`` tools. The SDK's response cache is
off: every listing is the server's own answer now (a changed description must be seen)."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hashlib
import json
import threading
from collections.abc import Coroutine
from dataclasses import dataclass, field
from typing import Any, TypeVar

import httpx2
import mcp_types
import rfc8785
from mcp.client.client import Client
from mcp.client.stdio import StdioServerParameters
from mcp.client.streamable_http import streamable_http_client

from fak.errors import FakError

__all__ = ["MAX_TOOLS", "McpConnection", "McpError", "McpLoop", "McpResult", "McpTool", "ServerAddress"]

MAX_TOOLS = 1000  # tools one server may list
MAX_DESCRIPTION = 64 * 1024  # bytes of one tool's canonical definition
T = TypeVar("T")


class McpError(FakError, code="mcp_error", status=502):
    """An MCP server could not be reached, failed, timed out or answered out of bounds (the
    message names the server's label and what happened, never its credentials)."""

    public = True


@dataclass(frozen=True)
class McpTool:
    """One tool as the server lists it. ``digest``: sha256 over the RFC 8785 canonical JSON of
    its name, description and input schema, what an operator pins. Both are computed once per
    object (a listing makes new objects; its ``input_schema`` is not changed after)."""

    name: str
    description: str
    input_schema: dict[str, Any]
    annotations: dict[str, Any] | None = None

    @functools.cached_property
    def canonical(self) -> bytes:
        return rfc8785.dumps({"name": self.name, "description": self.description, "inputSchema": self.input_schema})

    @functools.cached_property
    def digest(self) -> str:
        return "sha256:" + hashlib.sha256(self.canonical).hexdigest()

    def definition(self) -> dict[str, Any]:
        """The tool as an OpenAI function tool (what the model is shown)."""
        return {"type": "function", "function": {"name": self.name, "description": self.description,
                                                 "parameters": self.input_schema}}

    def listed(self) -> dict[str, Any]:
        """The tool as a Responses ``mcp_list_tools`` item lists it."""
        return {"name": self.name, "description": self.description, "input_schema": self.input_schema,
                "annotations": self.annotations}


@dataclass(frozen=True)
class McpResult:
    """A tool call's result: its text as the model will read it (structured content as JSON,
    else the text parts joined), its media type, and whether the tool reported an error."""

    text: str
    media_type: str
    is_error: bool = False

    @property
    def data(self) -> bytes:
        return self.text.encode("utf-8", "surrogatepass")


@dataclass(frozen=True)
class ServerAddress:
    """Where a server is and how fak reaches it: ``url`` (streamable HTTP) or ``command``
    (stdio); ``headers`` and ``env`` hold the secrets the settings named."""

    label: str
    url: str | None = None
    command: tuple[str, ...] = ()
    headers: dict[str, str] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)
    timeout_s: float = 30.0
    max_result_bytes: int = 1 << 20

    @property
    def source(self) -> str:
        """What a result's provenance names as its source: the URL, or ``stdio:<program>``."""
        return self.url if self.url is not None else "stdio:" + self.command[0].rsplit("/", 1)[-1]


class McpLoop:
    """One daemon thread running an asyncio loop for every MCP connection of a kernel."""

    def __init__(self) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="fak-mcp", daemon=True)
        self._thread.start()

    def run(self, coro: Coroutine[Any, Any, T], timeout: float) -> T:
        """Run ``coro`` on the loop and wait for it at most ``timeout`` seconds (then cancel it)."""
        future = asyncio.run_coroutine_threadsafe(coro, self._loop)
        try:
            return future.result(timeout)
        except TimeoutError:
            future.cancel()
            raise

    def close(self) -> None:
        if self._loop.is_running():
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(5)


def _text(result: mcp_types.CallToolResult) -> tuple[str, str]:
    """A result as (text, media type): its text parts (and embedded text resources) joined, as
    MCP clients show a result to a model; structured content as JSON only when the result has
    no text part. Other parts are named, not read (the model reads text)."""
    parts: list[str] = []
    for block in result.content:
        if isinstance(block, mcp_types.TextContent):
            parts.append(block.text)
        elif isinstance(block, mcp_types.EmbeddedResource) and isinstance(block.resource,
                                                                           mcp_types.TextResourceContents):
            parts.append(block.resource.text)
        else:
            parts.append(f"[{getattr(block, 'type', 'unknown')} content not read: the model reads text]")
    if not parts and result.structured_content is not None:
        return json.dumps(result.structured_content, ensure_ascii=False), "application/json"
    return "\n".join(parts), "text/plain"


class McpConnection:
    """The open connection to one server, opened on first use and again after a failure."""

    def __init__(self, address: ServerAddress, loop: McpLoop) -> None:
        self.address = address
        self._loop = loop
        self._client: Client | None = None
        self._stop: asyncio.Event | None = None
        self._opening: asyncio.Lock | None = None

    def _target(self) -> Any:
        a = self.address
        if a.url is not None:
            http = httpx2.AsyncClient(headers=a.headers, timeout=httpx2.Timeout(a.timeout_s))
            return streamable_http_client(a.url, http_client=http, max_sse_event_size=2 * a.max_result_bytes + 65536)
        return StdioServerParameters(command=a.command[0], args=list(a.command[1:]), env=dict(a.env))

    async def _hold(self, ready: asyncio.Future[Client], stop: asyncio.Event) -> None:
        """The connection's task: enter the client, hand it over, keep it open until ``stop``."""
        try:
            async with Client(self._target(), cache=None, read_timeout_seconds=self.address.timeout_s,
                              raise_exceptions=True) as client:
                ready.set_result(client)
                await stop.wait()
        except BaseException as exc:  # noqa: BLE001 - handed to the waiting request, or the connection ends
            if not ready.done():
                ready.set_exception(exc)
        finally:
            if self._stop is stop:
                self._client, self._stop = None, None

    async def _open(self) -> Client:
        if self._opening is None:
            self._opening = asyncio.Lock()
        async with self._opening:
            if self._client is not None:
                return self._client
            loop = asyncio.get_running_loop()
            ready: asyncio.Future[Client] = loop.create_future()
            stop = asyncio.Event()
            self._stop = stop
            loop.create_task(self._hold(ready, stop))
            self._client = await ready
            return self._client

    async def _drop(self, client: Client | None = None) -> None:
        """Close the open connection; with ``client``, only while it is still that one (a
        request that failed late must not close the connection opened again since)."""
        if client is not None and client is not self._client:
            return
        if self._stop is not None:
            self._stop.set()
        self._client, self._stop = None, None

    def _run(self, what: str, coro_of: Any) -> Any:
        """Run ``coro_of(client)`` against the open connection; a failure drops the connection
        and becomes an ``McpError`` naming the server and what failed."""
        label, timeout = self.address.label, self.address.timeout_s
        used: list[Client] = []

        async def attempt() -> Any:
            client = await self._open()
            used.append(client)
            try:
                return await coro_of(client)
            except BaseException:
                await self._drop(client)
                raise

        try:
            return self._loop.run(attempt(), timeout)
        except TimeoutError:
            # the cancelled request drops its connection on the loop later, maybe after the next
            # request took it: drop it now, before answering, so the next request opens a new one
            if used:
                with contextlib.suppress(Exception):
                    self._loop.run(self._drop(used[0]), 5)
            raise McpError(f"MCP server {label}: {what} timed out after {timeout:g} s") from None
        except McpError:
            raise
        except Exception as exc:  # noqa: BLE001 - the SDK's and the transport's errors, named
            raise McpError(f"MCP server {label}: {what} failed: {_reason(exc)}") from None

    def list_tools(self) -> list[McpTool]:
        """Every tool the server lists now (all pages), in its order."""

        async def listing(client: Client) -> list[McpTool]:
            tools: list[McpTool] = []
            cursor: str | None = None
            while True:
                page = await client.list_tools(cursor=cursor)
                for t in page.tools:
                    annotations = t.annotations.model_dump(exclude_none=True) if t.annotations else None
                    tools.append(McpTool(t.name, t.description or "", dict(t.input_schema), annotations))
                if len(tools) > MAX_TOOLS:
                    raise McpError(f"MCP server {self.address.label}: lists more than {MAX_TOOLS} tools")
                cursor = page.next_cursor
                if not cursor:
                    return tools

        tools: list[McpTool] = self._run("tools/list", listing)
        for t in tools:
            if len(t.canonical) > MAX_DESCRIPTION:
                raise McpError(f"MCP server {self.address.label}: tool {t.name[:64]!r} has a definition over "
                               f"{MAX_DESCRIPTION} bytes")
        return tools

    def call_tool(self, name: str, arguments: dict[str, Any]) -> McpResult:
        """Call tool ``name``; ``McpError`` when the server fails or its result is over the limit."""
        limit = self.address.max_result_bytes

        async def calling(client: Client) -> McpResult:
            result = await client.call_tool(name, arguments)
            text, media = _text(result)
            return McpResult(text, media, bool(result.is_error))

        result: McpResult = self._run(f"tools/call {name[:64]}", calling)
        size = len(result.data)
        if size > limit:
            raise McpError(f"MCP server {self.address.label}: the result of {name[:64]} is {size} bytes, over its "
                           f"limit of {limit} (max_result_bytes); nothing of it was read into the conversation")
        return result

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self._loop.run(self._drop(), 5)


def _reason(exc: BaseException) -> str:
    """A short reason, the innermost of an exception group."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    text = str(exc).strip() or type(exc).__name__
    return text[:300]
