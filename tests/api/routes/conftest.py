"""The API world the route and isolation tests share: conftest's settings with a writable copy
of the default policy, and ``World`` (two tenants with a key per role, acme's session) on the
live server (``support.api_world``)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from support.api_world import World, writable_policy

from fak.api.server import LiveServer
from fak.settings import Settings


@pytest.fixture
def settings(settings: Settings, tmp_path) -> Settings:  # noqa: ANN001
    """conftest's settings with a writable copy of the default policy (PUT /v1/policy writes
    it; the packaged file is never the target)."""
    return writable_policy(settings, tmp_path)


@pytest.fixture
def world(live_server: LiveServer) -> Iterator[World]:
    w = World(live_server)
    yield w
    w.close()
