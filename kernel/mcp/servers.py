"""The MCP servers a deployment declares (``Settings.mcp_servers``, docs/mcp.md), by label.

Which servers exist is the deployment's decision, never a request's: a request names a label
(and, in the Responses API, the server's URL, which must be the declared one), and only a
declared server is reached. Each server's tools pass two filters before a model is shown them:
the deployment's ``allowed_tools`` and the pins (``fak.kernel.mcp.pins``). Results are admitted
by the caller under ``provenance(tool)`` (``mcp:<label>/<tool>``) with the server's ``source``."""

from __future__ import annotations

import threading
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from fak.errors import Conflict, InvalidInput
from fak.kernel.mcp.client import McpConnection, McpLoop, McpResult, McpTool, ServerAddress
from fak.kernel.mcp.pins import PinCheck, ToolPins, Withheld
from fak.protocols import AuditSink
from fak.settings import Settings
from fak.state.store import StateStore

__all__ = ["McpOffer", "McpServer", "McpServers", "UnknownMcpServer", "provenance"]

PREFIX = "mcp:"


def provenance(label: str, tool: str) -> str:
    """The tool name a result of ``tool`` on server ``label`` is admitted and governed under."""
    return f"{PREFIX}{label}/{tool}"


def definitions_producer(label: str) -> str:
    """The tool name a server's tool list is admitted under (its descriptions are content)."""
    return f"{PREFIX}{label}"


class UnknownMcpServer(InvalidInput):
    """A request named an MCP server the deployment does not declare."""

    code = "unknown_mcp_server"


@dataclass(frozen=True)
class McpOffer:
    """What one server offers now: the tools a model may be shown (after ``allowed_tools`` and
    the pins) and those withheld, with why."""

    label: str
    source: str
    offered: tuple[McpTool, ...]
    withheld: tuple[Withheld, ...]

    def find(self, name: str) -> McpTool | None:
        return next((t for t in self.offered if t.name == name), None)


@dataclass
class McpServer:
    """One declared server and its open connection."""

    address: ServerAddress
    allowed: frozenset[str]
    connection: McpConnection

    @property
    def label(self) -> str:
        return self.address.label

    @property
    def source(self) -> str:
        return self.address.source


class McpServers:
    """The deployment's MCP servers; thread-safe. ``pins`` checks every listing."""

    def __init__(self, servers: Mapping[str, McpServer], pins: ToolPins, loop: McpLoop | None) -> None:
        self._by_label = dict(servers)
        self.pins = pins
        self._loop = loop
        self._lock = threading.Lock()

    @classmethod
    def from_settings(cls, settings: Settings, state: StateStore, audit: AuditSink, mac_key: bytes) -> McpServers:
        pins = ToolPins(state, audit, mac_key)
        if not settings.mcp_servers:
            return cls({}, pins, None)
        loop = McpLoop()
        servers = {}
        for label, spec in settings.mcp_servers.items():
            headers, env = settings.mcp_secrets(label)
            address = ServerAddress(label, spec.url, tuple(spec.command or ()), headers, env, spec.timeout_s,
                                    spec.max_result_bytes)
            servers[label] = McpServer(address, frozenset(spec.allowed_tools), McpConnection(address, loop))
        return cls(servers, pins, loop)

    def labels(self) -> list[str]:
        return sorted(self._by_label)

    def get(self, label: str, url: str | None = None) -> McpServer:
        """The declared server ``label``; with ``url``, it must be the server's declared URL
        (``UnknownMcpServer``, a 400 naming what was asked, otherwise)."""
        server = self._by_label.get(label)
        if server is None:
            raise UnknownMcpServer(f"MCP server {label[:64]!r} is not declared by this deployment (mcp_servers: "
                                   f"{', '.join(self.labels()) or 'none'})", param="tools")
        if url is not None and (server.address.url is None or url.rstrip("/") != server.address.url.rstrip("/")):
            raise UnknownMcpServer(f"server_url {url[:200]!r} is not the URL this deployment declares for MCP server "
                                   f"{label!r}", param="tools")
        return server

    def tools(self, label: str) -> list[McpTool]:
        """Every tool the server lists now, before any filter (what an operator approves)."""
        return self.get(label).connection.list_tools()

    def offer(self, label: str, allowed: frozenset[str] | None = None,
              listing: Sequence[McpTool] | None = None) -> McpOffer:
        """The server's tools as a model may be shown them now: listed (or ``listing``, a
        listing of the server the caller holds), kept to the deployment's ``allowed_tools`` (and
        ``allowed``, a request's narrower list), checked against the pins as they are now."""
        server = self.get(label)
        tools = server.connection.list_tools() if listing is None else listing
        listed = [t for t in tools
                  if (not server.allowed or t.name in server.allowed) and (allowed is None or t.name in allowed)]
        check: PinCheck = self.pins.check(label, listed)
        return McpOffer(label, server.source, check.offered, check.withheld)

    def approve(self, label: str, principal: str,
                expected: Collection[str] | None = None) -> tuple[int, list[McpTool]]:
        """Pin the server's tools as listed now (audited); its audit index and the tools. With
        ``expected`` (the digests an operator reviewed), only a listing of exactly those digests
        is pinned: ``Conflict`` (409) when the server changed since, and nothing is pinned."""
        tools = self.tools(label)
        if expected is not None and sorted(set(expected)) != sorted({t.digest for t in tools}):
            now = {t.digest: t.name for t in tools}
            new = sorted(f"{name} ({digest})" for digest, name in now.items() if digest not in set(expected))
            gone = sorted(set(expected) - set(now))
            raise Conflict(f"MCP server {label} lists other tools than the ones reviewed, nothing was pinned: "
                           f"{len(new)} not reviewed{': ' + ', '.join(new[:10]) if new else ''}; {len(gone)} "
                           f"reviewed but not listed now{': ' + ', '.join(gone[:10]) if gone else ''}; list it "
                           f"again and review what changed")
        try:
            return self.pins.approve(label, tools, principal), tools
        except ValueError as exc:  # a tool name the log cannot carry
            raise Conflict(str(exc)) from None

    def call(self, label: str, tool: str, arguments: dict[str, Any]) -> McpResult:
        return self.get(label).connection.call_tool(tool, arguments)

    def close(self) -> None:
        for server in self._by_label.values():
            server.connection.close()
        if self._loop is not None:
            self._loop.close()
