"""``/mcp``: the MCP gateway's protocol adapter (docs/mcp.md, "The MCP gateway"). The MCP SDK's
low-level ``Server`` over its ``StreamableHTTPSessionManager`` (both protocol eras: the 2025
handshake with ``Mcp-Session-Id``, and the 2026 single-exchange requests), its handlers handing
each request to ``fak.kernel.gateway.mcp_gateway.McpGateway`` in a worker thread.

Before the SDK sees a request: the same Bearer API keys as the REST API (``api/deps.py``: a
missing or unknown key is 401, audited; a role other than agent or admin is 403), and the
binding (``fak-session``, a session of the caller's tenant: another tenant's id is 404, as an
unknown one). The SDK keeps an MCP session to the credential that opened it. The session
manager's task group is started on the first request (``fak serve`` and the tests' servers run
with or without the ASGI lifespan) and stopped, with the unbound connections' sessions, when
the app shuts down."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import anyio
import mcp_types as types
from mcp.server.auth.middleware.bearer_auth import AuthenticatedUser
from mcp.server.auth.provider import AccessToken
from mcp.server.context import ServerRequestContext
from mcp.server.lowlevel import Server
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from mcp.shared.exceptions import MCPError
from starlette.requests import Request
from starlette.types import Receive, Scope, Send

from fak import __version__
from fak.api import deps
from fak.api.keys import Principal
from fak.errors import FakError
from fak.kernel.facade import Kernel
from fak.kernel.gateway.mcp_gateway import GatewayTool, McpGateway
from fak.kernel.session.caller import Caller
from fak.kernel.session.kernel_session import KernelSession

__all__ = ["BIND_HEADER", "BIND_META", "McpEndpoint"]

BIND_HEADER = "fak-session"  # the fak session an MCP client binds its calls to
BIND_META = "fak.dev/session"  # the same, in a request's (or the initialize request's) ``_meta``
SWEEP_S = 60.0  # how often idle unbound connections' sessions are looked for
JSON_RESPONSE = False  # answer a request with one JSON body instead of an SSE stream (bench/mcp.py measures both)
_STATE = "fak_mcp"
log = logging.getLogger("fak.api")


@dataclass(frozen=True)
class _Request:
    """Who asks and in which session, read before the SDK sees the request."""

    caller: Caller
    bound: str | None  # the fak session named by the header
    connection: str  # what stands for the MCP connection of an unbound client


def _meta_session(meta: Mapping[str, Any] | None) -> str | None:
    value = (meta or {}).get(BIND_META)
    return value if isinstance(value, str) and value else None


class McpEndpoint:
    """The ASGI app at ``/mcp``."""

    def __init__(self, kernel: Kernel) -> None:
        self.kernel = kernel
        self.gateway = McpGateway(kernel.services, kernel)
        self.server: Server[Any] = Server("fak", version=__version__, instructions=(
            "fak's MCP gateway: the deployment's MCP servers, each call authorized by fak's policy against "
            "the bound fak session (header fak-session) before it is forwarded."),
            on_list_tools=self._list_tools, on_call_tool=self._call_tool)
        self.manager: StreamableHTTPSessionManager | None = None
        self._ready: asyncio.Event | None = None
        self._runner: asyncio.Task[None] | None = None

    # --- ASGI ------------------------------------------------------------------------------
    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        request = Request(scope, receive)
        who: Principal = deps.AGENT(request, deps.principal(request))  # 401 / 403, audited
        caller = deps.caller(who)
        bound = request.headers.get(BIND_HEADER) or None
        if bound is not None:  # a session of the caller's tenant (NotFound otherwise), checked before any work
            await anyio.to_thread.run_sync(self.gateway.bound, caller.tenant, bound)
        mcp_session = request.headers.get("mcp-session-id")
        connection = f"mcp:{mcp_session}" if mcp_session else f"key:{who.key_id}"
        scope.setdefault("state", {})[_STATE] = _Request(caller, bound, connection)
        # the SDK keeps an MCP session to the credential that opened it (another key's request: 404)
        scope["user"] = AuthenticatedUser(AccessToken(token=f"key:{who.key_id}", client_id=f"{who.tenant}/{who.key_id}",
                                                      scopes=[]))
        manager = await self._started()
        await manager.handle_request(scope, receive, send)
        if request.method == "DELETE" and mcp_session:  # the client ended its MCP session
            await anyio.to_thread.run_sync(self.gateway.end, caller.tenant, connection)

    async def _started(self) -> StreamableHTTPSessionManager:
        """The session manager, its task group started on this event loop on first use."""
        if self._ready is None:
            self._ready = asyncio.Event()
            self._runner = asyncio.get_running_loop().create_task(self._run(self._ready))
        await self._ready.wait()
        assert self.manager is not None
        return self.manager

    async def _run(self, ready: asyncio.Event) -> None:
        manager = StreamableHTTPSessionManager(self.server, json_response=JSON_RESPONSE,
                                              session_idle_timeout=self.gateway.idle_s)
        async with manager.run():
            self.manager = manager
            ready.set()
            while True:  # unbound connections idle past their time lose their sessions
                await anyio.sleep(SWEEP_S)
                await anyio.to_thread.run_sync(self.gateway.sweep)

    async def aclose(self) -> None:
        """Stop the session manager and delete the unbound connections' sessions."""
        if self._runner is not None:
            self._runner.cancel()
            with contextlib.suppress(BaseException):
                await self._runner
        await anyio.to_thread.run_sync(self.gateway.close)

    # --- the MCP handlers ------------------------------------------------------------------
    def _session(self, ctx: ServerRequestContext[Any, Any]) -> tuple[_Request, KernelSession]:
        http: Request | None = ctx.request if isinstance(ctx.request, Request) else None
        asked: _Request | None = http.scope.get("state", {}).get(_STATE) if http is not None else None
        if asked is None:  # every request came through __call__
            raise RuntimeError("an MCP request reached the gateway without its caller")
        sid = asked.bound or _meta_session(ctx.meta) or _meta_session(_init_meta(ctx))
        if sid is not None:
            return asked, self.gateway.bound(asked.caller.tenant, sid)
        return asked, self.gateway.connection_session(asked.caller.tenant, asked.connection)

    async def _list_tools(self, ctx: ServerRequestContext[Any, Any],
                          params: types.PaginatedRequestParams | None) -> types.ListToolsResult:
        def listing() -> list[GatewayTool]:
            _, ks = self._session(ctx)
            return self.gateway.list_tools(ks)

        try:
            tools = await anyio.to_thread.run_sync(listing)
        except FakError as exc:  # an unknown session, a busy one, a full context: said, not an internal error
            raise MCPError(types.INVALID_REQUEST, _said(exc)) from None
        return types.ListToolsResult(tools=[_tool(t) for t in tools])

    async def _call_tool(self, ctx: ServerRequestContext[Any, Any],
                         params: types.CallToolRequestParams) -> types.CallToolResult:
        def calling() -> types.CallToolResult:
            asked, ks = self._session(ctx)
            try:
                result = self.gateway.call(ks, params.name, params.arguments, asked.caller.principal)
            except FakError as exc:  # a busy session, a result over the context: nothing of it was admitted
                return types.CallToolResult(content=[types.TextContent(type="text", text=_said(exc))], is_error=True,
                                            meta={"fak.dev/outcome": "refused", "fak.dev/error": exc.code, BIND_META: ks.id})
            meta = result.meta() | {BIND_META: ks.id}
            return types.CallToolResult(content=[types.TextContent(type="text", text=result.text)],
                                        is_error=result.is_error, meta=meta)

        try:
            return await anyio.to_thread.run_sync(calling)
        except FakError as exc:  # the session named in _meta is unknown here, or another tenant's
            raise MCPError(types.INVALID_REQUEST, _said(exc)) from None


def _said(exc: FakError) -> str:
    """What a client is told of a refusal (an internal error says nothing of the internals)."""
    if exc.status >= 500 and not getattr(exc, "public", False):
        log.error("mcp gateway: %s: %s", exc.code, exc)  # as the REST API's problem handler does
        return f"fak: {exc.code} (logged on the server)"
    return f"fak: {exc.code}: {(str(exc).splitlines() or [exc.code])[0]}"


def _init_meta(ctx: ServerRequestContext[Any, Any]) -> Mapping[str, Any] | None:
    """The ``_meta`` of the connection's initialize request (2025 handshake), if it had one."""
    params = getattr(ctx.session, "client_params", None)
    meta = getattr(params, "meta", None) if params is not None else None
    return meta if isinstance(meta, Mapping) else None


def _tool(t: GatewayTool) -> types.Tool:
    annotations = types.ToolAnnotations.model_validate(t.tool.annotations) if t.tool.annotations else None
    return types.Tool(name=t.name, description=t.tool.description, input_schema=t.tool.input_schema,
                      annotations=annotations)
