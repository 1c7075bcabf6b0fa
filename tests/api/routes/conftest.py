"""The API world the route and isolation tests share: conftest's settings with a writable copy
of the default policy and one declared MCP server (a real one, ``support.mcp_servers``), and
``World`` (two tenants with a key per role, acme's session) on the live server
(``support.api_world``)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from support.api_world import World, writable_policy
from support.mcp_servers import MailServer, RunningServer, running

from fak.api.server import LiveServer
from fak.settings import McpServerSettings, Settings


@pytest.fixture
def mail_mcp() -> Iterator[RunningServer]:
    with running(MailServer()) as srv:
        yield srv


@pytest.fixture
def settings(settings: Settings, tmp_path, mail_mcp: RunningServer) -> Settings:  # noqa: ANN001
    """conftest's settings with a writable copy of the default policy (PUT /v1/policy writes
    it; the packaged file is never the target) and the MCP server ``mail`` (the operator's
    /v1/mcp/servers routes list and approve it)."""
    return writable_policy(settings, tmp_path).model_copy(update={"mcp_servers": {
        "mail": McpServerSettings(url=mail_mcp.url, timeout_s=10)}})


@pytest.fixture
def world(live_server: LiveServer) -> Iterator[World]:
    w = World(live_server)
    yield w
    w.close()
