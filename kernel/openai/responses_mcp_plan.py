"""The plan of a Responses request's ``mcp`` tools (``fak.kernel.openai.responses_mcp``): each
server's offer and which calls the request asks about, and the tools by the names the model is
shown. Its own module so that the request's ``Plan`` (``responses_request``) can hold one
without importing the loop, which imports the request."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from fak import wire_responses as wr
from fak.kernel.mcp.client import McpTool
from fak.kernel.mcp.servers import McpOffer, definitions_producer, provenance
from fak.kernel.openai import chat

__all__ = ["McpPlan", "ServerUse", "source_url"]


@dataclass(frozen=True)
class ServerUse:
    """One ``mcp`` entry of the request: the server's offer now and which calls the request asks about."""

    label: str
    offer: McpOffer
    ask: Callable[[str], bool]  # tool name -> the request wants an approval before it runs
    item: wr.McpListToolsItem


@dataclass(frozen=True)
class McpPlan:
    """The request's MCP servers and their tools by the names the model is shown."""

    servers: tuple[ServerUse, ...]
    tools: dict[str, tuple[ServerUse, McpTool]]
    ignored: tuple[str, ...] = ()

    def definitions(self) -> list[dict[str, Any]]:
        return [t.definition() for _, t in self.tools.values()]

    def hosted(self, results: dict[str, tuple[str, str | None]]) -> chat.Hosted:
        groups = tuple(chat.ToolGroup(definitions_producer(s.label), source_url(s.offer.source),
                                      frozenset(t.name for t in s.offer.offered)) for s in self.servers)
        governed = {name: provenance(use.label, name) for name, (use, _) in self.tools.items()}
        return chat.Hosted(groups, governed, dict(results))


def source_url(source: str) -> str | None:
    """A result's source as the gate reads it: the server's URL (a stdio server has none)."""
    return source if source.startswith(("http://", "https://")) else None
