"""The ``live_server`` fixture: a real uvicorn server on 127.0.0.1 (a free port, a
background thread) around ``create_app(kernel)`` (``fak.api.server.serve``), for API
tests that go through sockets, HTTP parsing and streaming as a client does.

    from api_server import live_server  # noqa: F401  (the fixture)

    def test_x(live_server):
        key = live_server.key("acme", "agent")
        with live_server.client(key) as c:
            assert c.get("/v1/sessions").status_code == 200

``live_server`` wraps the ``kernel`` fixture of conftest.py (override ``settings`` or
``kernel`` in a test module to change it); ``serve(kernel, **create_app_options)`` is the
same as a context manager, for a second server or other app options (``max_body``).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from fak.api.server import LiveServer, serve

__all__ = ["LiveServer", "live_server", "serve"]


@pytest.fixture
def live_server(kernel) -> Iterator[LiveServer]:  # noqa: ANN001
    """A real uvicorn server on 127.0.0.1 around ``create_app(kernel)``; stopped after the test."""
    with serve(kernel) as live:
        yield live
